// Package conversations is the multi-turn chat traffic of `make demo`
// (e2e/demo) and of its end-to-end test (TestDemoConversations in e2e):
// a few users chat with the model at once, each turn resending the whole
// history plus a new user message as an OpenAI client does, and each turn
// reports which (engine, DP rank) served its prefill and decode legs and
// how many prompt tokens the engines found cached.
//
// With duet's default policies (least_cost on both roles) a conversation
// keeps the prefill rank and the decode rank whose caches hold its history,
// and conversations that start together go to different ranks. Play makes
// that deterministic rather than likely:
//
//   - The first turns are sent together, streamed, each once the previous
//     one's response headers arrived (so duet routed it), while every one
//     of them is still generating. A new conversation matches no cache, so
//     every rank prices it the same but for load: on prefill, ties go to the
//     rank whose cache holds the least, so each first turn gets a rank no
//     other conversation's history is on; on decode, to the least loaded
//     rank, and the other first turns still load theirs.
//   - The later turns are sent one at a time, each once duet sees no load
//     on any rank (the previous turn's reservations ended and scraped), so
//     the only difference between ranks is what their caches hold.
//
// Check states the claim Play's turns must satisfy.
package conversations

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/e2e/harness"
)

// Conversation is one user's chat: a system prompt and the user message of
// each turn.
type Conversation struct {
	// Name labels the conversation in reports.
	Name string
	// System is the system prompt, sent first in every turn.
	System string
	// Users are the user messages, one per turn.
	Users []string
}

// Token budgets of the answers (max_tokens). The first turns generate long
// enough (about 1.4 s on the demo's engines) that each is still running
// while the others are routed; the later ones are short.
const (
	FirstTurnTokens = 200
	LaterTurnTokens = 48
)

// Demo returns the demo's conversations: three users, four turns each, with
// system prompts of about 3, 5 and 8 kB (the last, routed last of the first
// turns, is the largest: see Play) that share no prefix.
func Demo() []Conversation {
	return []Conversation{
		{
			Name:   "support",
			System: document("You are the support assistant of Fibrelink, a broadband provider. Answer from the policy below; cite its clause numbers.", supportClauses, 30),
			Users: []string{
				"My connection drops every evening around 9 pm. What can I do?",
				"I already restarted the router twice. Can you send a technician?",
				"Will the visit cost anything? My contract started in March.",
				"Please book the earliest slot and confirm by email.",
			},
		},
		{
			Name:   "code-review",
			System: document("You review Go pull requests for the payments team. Apply the style guide below and name the rule each comment follows.", reviewClauses, 45),
			Users: []string{
				"Review this diff: func Pay(a int) error { if a < 0 { panic(\"neg\") }; return nil }",
				"I replaced the panic with an error. Anything else?",
				"Should the amount be an int64 of cents instead?",
				"Summarise the review in three bullet points for the PR description.",
			},
		},
		{
			Name:   "contract",
			System: document("You are a paralegal assistant. The master services agreement below governs every answer; quote the section you rely on.", contractClauses, 70),
			Users: []string{
				"Can the customer terminate early, and with how much notice?",
				"What happens to prepaid fees if they do?",
				"Who owns the work product delivered before termination?",
				"Draft a two-sentence termination notice that complies with it.",
			},
		},
	}
}

// document renders a system prompt: intro, then n numbered clauses cycling
// through clauses.
func document(intro string, clauses []string, n int) string {
	var b strings.Builder
	b.WriteString(intro)
	b.WriteString("\n")
	for i := range n {
		fmt.Fprintf(&b, "%d. %s\n", i+1, clauses[i%len(clauses)])
	}
	return b.String()
}

var supportClauses = []string{
	"Evening slowdowns are first checked remotely: line statistics for the past 7 days, then a router firmware check.",
	"A technician visit is offered when remote checks find no fault and the customer has restarted the router.",
	"Visits are free within the first 12 months of a contract and when the fault is on Fibrelink's side.",
	"Bookings are confirmed by email within one hour, with a two-hour arrival window.",
	"Never promise compensation; refer compensation requests to the billing team.",
}

var reviewClauses = []string{
	"Errors are returned, never panicked, except for programmer errors that cannot happen at run time.",
	"Money is an int64 count of the currency's minor unit; floats never hold amounts.",
	"Exported names have doc comments that start with the name.",
	"Every error is wrapped with the operation that failed, using fmt.Errorf and %w.",
	"Tests are table-driven and name each case after the behaviour it checks.",
	"No package-level variables hold state; pass dependencies explicitly.",
}

var contractClauses = []string{
	"Term. The agreement runs for 24 months from the effective date and renews for 12 months unless either party objects.",
	"Termination for convenience. The customer may terminate on 90 days' written notice after the first 6 months.",
	"Fees. Fees prepaid for periods after termination are refunded pro rata within 30 days.",
	"Work product. Deliverables paid for vest in the customer on payment; pre-existing tools stay with the provider.",
	"Notices. Notices are written, signed and sent by email to the addresses in schedule 2.",
	"Liability. Each party's liability is capped at the fees paid in the 12 months before the claim.",
	"Confidentiality survives termination for 5 years.",
}

// Target is an (engine, DP rank) pair that served one leg of a turn.
type Target struct {
	// Engine names the engine by role and position in the stack, e.g.
	// decode-1.
	Engine string
	// Address is the engine's ip:port.
	Address string
	// Rank is the DP rank, -1 when the engine recorded none.
	Rank int
}

// String returns e.g. "decode-1 dp0".
func (t Target) String() string {
	if t.Rank < 0 {
		return t.Engine + " dp-"
	}
	return t.Engine + " dp" + strconv.Itoa(t.Rank)
}

// Turn is what one turn of a conversation showed.
type Turn struct {
	// Conversation is the conversation's Name; Index the turn, from 1.
	Conversation string
	Index        int
	// Prefill and Decode are the targets that served the two legs, as the
	// engines recorded them.
	Prefill, Decode Target
	// PromptTokens is the usage's prompt_tokens.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens: the
	// prompt tokens the engines did not compute or transfer again; -1 when
	// the engines do not report it.
	CachedTokens int
	// Answer is the generated text, sent back in the next turn.
	Answer string
}

// Play sends convs through s's Envoy (see the package documentation for
// the order) and calls report for each turn: the first turns in
// conversation order once all have ended, then each later turn as it ends.
// It returns every turn in that order.
func Play(ctx context.Context, s *harness.Stack, convs []Conversation, report func(Turn)) ([]Turn, error) {
	for _, c := range convs {
		if len(c.Users) == 0 {
			return nil, fmt.Errorf("conversation %s has no turns", c.Name)
		}
	}
	if err := waitStatus(ctx, s, "duet to discover the decode engines' radix cache, and to see no load", func(st status) bool {
		return st.idle() && st.decodeCacheEverywhere()
	}); err != nil {
		return nil, err
	}
	histories := make([][]message, len(convs))
	for i, c := range convs {
		histories[i] = []message{{"system", c.System}}
	}
	var turns []Turn
	// The first turns, together.
	var wg sync.WaitGroup
	firsts := make([]Turn, len(convs))
	errs := make([]error, len(convs))
	ended := make([]chan struct{}, len(convs))
	for i, c := range convs {
		histories[i] = append(histories[i], message{"user", c.Users[0]})
		resp, id, err := post(ctx, s, c.Name, 1, seed(i, 1), histories[i], FirstTurnTokens)
		if err != nil {
			wg.Wait()
			return nil, err
		}
		for j := range i {
			select {
			case <-ended[j]:
				// That turn ended by the time this one was routed: duet
				// may have seen its decode rank idle again.
				wg.Wait()
				resp.Body.Close()
				return nil, fmt.Errorf("the first turn of %s ended by the time the first turn of %s was routed: this machine is too slow for the demo's timing", convs[j].Name, c.Name)
			default:
			}
		}
		ended[i] = make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			firsts[i], errs[i] = finish(ctx, s, resp, id, c.Name, 1, ended[i])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, t := range firsts {
		histories[i] = append(histories[i], message{"assistant", t.Answer})
		turns = append(turns, t)
		report(t)
	}
	// The later turns, one at a time, round robin over the conversations.
	for k := 1; ; k++ {
		sent := false
		for i, c := range convs {
			if k >= len(c.Users) {
				continue
			}
			sent = true
			if err := waitStatus(ctx, s, "duet to see no load", status.idle); err != nil {
				return turns, err
			}
			histories[i] = append(histories[i], message{"user", c.Users[k]})
			resp, id, err := post(ctx, s, c.Name, k+1, seed(i, k+1), histories[i], LaterTurnTokens)
			if err != nil {
				return turns, err
			}
			t, err := finish(ctx, s, resp, id, c.Name, k+1, nil)
			if err != nil {
				return turns, err
			}
			histories[i] = append(histories[i], message{"assistant", t.Answer})
			turns = append(turns, t)
			report(t)
		}
		if !sent {
			return turns, nil
		}
	}
}

// Check returns an error unless turns show what the demo claims: every
// conversation's turns were served by one prefill target and one decode
// target, different conversations by different ones, and every turn after
// the first reported at least the previous turn's prompt as cached (when
// the engines report cached tokens).
func Check(turns []Turn) error {
	var errs []error
	first := map[string]Turn{}
	last := map[string]Turn{}
	prefillOf, decodeOf := map[Target]string{}, map[Target]string{}
	for _, t := range turns {
		f, seen := first[t.Conversation]
		if !seen {
			first[t.Conversation] = t
			if other, taken := prefillOf[t.Prefill]; taken {
				errs = append(errs, fmt.Errorf("%s and %s share the prefill target %s", other, t.Conversation, t.Prefill))
			}
			if other, taken := decodeOf[t.Decode]; taken {
				errs = append(errs, fmt.Errorf("%s and %s share the decode target %s", other, t.Conversation, t.Decode))
			}
			prefillOf[t.Prefill], decodeOf[t.Decode] = t.Conversation, t.Conversation
		} else {
			if t.Prefill != f.Prefill {
				errs = append(errs, fmt.Errorf("%s turn %d: prefill on %s, turn %d on %s", t.Conversation, t.Index, t.Prefill, f.Index, f.Prefill))
			}
			if t.Decode != f.Decode {
				errs = append(errs, fmt.Errorf("%s turn %d: decode on %s, turn %d on %s", t.Conversation, t.Index, t.Decode, f.Index, f.Decode))
			}
			if prev := last[t.Conversation]; t.CachedTokens >= 0 && t.CachedTokens < prev.PromptTokens {
				errs = append(errs, fmt.Errorf("%s turn %d: %d prompt tokens cached, less than turn %d's prompt (%d)", t.Conversation, t.Index, t.CachedTokens, prev.Index, prev.PromptTokens))
			}
		}
		last[t.Conversation] = t
	}
	return errors.Join(errs...)
}

// message is one chat message.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// turnTimeout bounds one turn, from its request to its legs' records.
const turnTimeout = 30 * time.Second

// seed is the body's seed of turn of conversation i: the simulated
// engines' answer is a function of it.
func seed(i, turn int) int { return 100*(i+1) + turn }

// post sends one streamed turn of conversation name with history, and
// returns once the response headers arrived (duet has routed it), with the
// client's request id.
func post(ctx context.Context, s *harness.Stack, name string, turn, seed int, history []message, maxTokens int) (*http.Response, string, error) {
	body, err := json.Marshal(map[string]any{
		"model":          "sim-model",
		"messages":       history,
		"max_tokens":     maxTokens,
		"seed":           seed,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	})
	if err != nil {
		return nil, "", err
	}
	id := fmt.Sprintf("demo-%s-%d-%d", name, turn, time.Now().UnixNano())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.EnvoyURL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-request-id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("%s turn %d: %w", name, turn, err)
	}
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		resp.Body.Close()
		return nil, "", fmt.Errorf("%s turn %d: status %d: %s", name, turn, resp.StatusCode, b.String())
	}
	return resp, id, nil
}

// finish reads a turn's stream to its end, closes ended (when not nil)
// there, and finds its legs' records.
func finish(ctx context.Context, s *harness.Stack, resp *http.Response, id, name string, turn int, ended chan struct{}) (Turn, error) {
	defer resp.Body.Close()
	signal := func() {
		if ended != nil {
			close(ended)
			ended = nil
		}
	}
	defer signal()
	t := Turn{Conversation: name, Index: turn, CachedTokens: -1}
	var answer strings.Builder
	usage := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		ev := gjson.Parse(data)
		if e := ev.Get("error"); e.Exists() {
			return t, fmt.Errorf("%s turn %d: %s", name, turn, e.Raw)
		}
		answer.WriteString(ev.Get("choices.0.delta.content").String())
		if u := ev.Get("usage"); u.IsObject() {
			usage = true
			t.PromptTokens = int(u.Get("prompt_tokens").Int())
			if c := u.Get("prompt_tokens_details.cached_tokens"); c.Exists() {
				t.CachedTokens = int(c.Int())
			}
		}
	}
	signal()
	if err := sc.Err(); err != nil {
		return t, fmt.Errorf("%s turn %d: read the stream: %w", name, turn, err)
	}
	if !usage || answer.Len() == 0 {
		return t, fmt.Errorf("%s turn %d: the stream ended without an answer and its usage", name, turn)
	}
	t.Answer = answer.String()
	ctx, cancel := context.WithTimeout(ctx, turnTimeout)
	defer cancel()
	var err error
	if t.Prefill, err = leg(ctx, s.Prefill, "prefill", id); err != nil {
		return t, fmt.Errorf("%s turn %d: %w", name, turn, err)
	}
	if t.Decode, err = leg(ctx, s.Decode, "decode", id); err != nil {
		return t, fmt.Errorf("%s turn %d: %w", name, turn, err)
	}
	return t, nil
}

// leg returns the target that recorded request id among sims, the engines
// of role.
func leg(ctx context.Context, sims []*harness.Sim, role, id string) (Target, error) {
	found, err := harness.WaitRecords(ctx, sims, id, 1, 5*time.Second)
	if err != nil {
		return Target{}, fmt.Errorf("its %s leg: %w", role, err)
	}
	sim, rec, err := harness.OnlyRecord(found)
	if err != nil {
		return Target{}, fmt.Errorf("its %s leg: %w", role, err)
	}
	t := Target{Address: sim.Address, Rank: -1}
	for i, e := range sims {
		if e == sim {
			t.Engine = fmt.Sprintf("%s-%d", role, i)
		}
	}
	if rec.DPRank != nil {
		t.Rank = *rec.DPRank
	}
	return t, nil
}

// status is the part of duet's /status.json that Play and Policies read.
type status struct {
	Roles []struct {
		Role   string `json:"role"`
		Policy string `json:"policy"`
	} `json:"roles"`
	Endpoints []struct {
		Role        string `json:"role"`
		Ready       bool   `json:"ready"`
		DecodeCache string `json:"decode_cache"`
		Ranks       []struct {
			Tokens    int64 `json:"tokens"`
			LoadFresh bool  `json:"load_fresh"`
		} `json:"ranks"`
	} `json:"endpoints"`
}

// idle reports whether every endpoint is ready and duet sees no load, from
// a fresh scrape, on any of its ranks.
func (st status) idle() bool {
	if len(st.Endpoints) == 0 {
		return false
	}
	for _, e := range st.Endpoints {
		if !e.Ready || len(e.Ranks) == 0 {
			return false
		}
		for _, r := range e.Ranks {
			if r.Tokens != 0 || !r.LoadFresh {
				return false
			}
		}
	}
	return true
}

// decodeCacheEverywhere reports whether duet found the decode radix cache
// on every decode engine.
func (st status) decodeCacheEverywhere() bool {
	for _, e := range st.Endpoints {
		if e.Role == "decode" && !strings.HasPrefix(e.DecodeCache, "radix") {
			return false
		}
	}
	return true
}

// statusWait bounds waitStatus.
const statusWait = 15 * time.Second

// waitStatus polls duet's /status.json until ok accepts it.
func waitStatus(ctx context.Context, s *harness.Stack, what string, ok func(status) bool) error {
	ctx, cancel := context.WithTimeout(ctx, statusWait)
	defer cancel()
	for {
		var st status
		err := harness.GetJSON(ctx, s.DuetAdminURL+"/status.json", &st)
		if err == nil && ok(st) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Policies returns the policies duet runs on each role, as its status
// reports them, by role (prefill, decode).
func Policies(ctx context.Context, s *harness.Stack) (map[string]string, error) {
	var st status
	if err := harness.GetJSON(ctx, s.DuetAdminURL+"/status.json", &st); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range st.Roles {
		out[r.Role] = r.Policy
	}
	return out, nil
}

// DecodeCaches returns what duet's status says of each decode engine's
// cache (radix, radix+host or off), in the stack's order of s.Decode.
func DecodeCaches(ctx context.Context, s *harness.Stack) ([]string, error) {
	var st status
	if err := harness.GetJSON(ctx, s.DuetAdminURL+"/status.json", &st); err != nil {
		return nil, err
	}
	var out []string
	for _, e := range st.Endpoints {
		if e.Role == "decode" {
			out = append(out, e.DecodeCache)
		}
	}
	return out, nil
}
