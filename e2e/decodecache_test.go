package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/e2e/harness"
)

// decodeCacheSim runs duet-sim's engine model fast enough for a test: a
// dense 8B engine with two independent DP ranks, ten times real time.
var decodeCacheSim = []string{"--profile", "dense-8b-h100", "--dp-size", "2", "--time-scale", "10"}

// TestDecodeCacheKeepsTheConversation sends a three-turn conversation
// through a real Envoy to a decode engine running SGLang's decode radix
// cache (duet-sim --disaggregation-decode-enable-radix-cache). Turn 1 goes
// to rank 1 because a long request holds rank 0; that request then ends,
// and both ranks are idle. By load alone (least_cost with
// ignore_decode_cache, the control) turn 2 goes to rank 0, the first of
// two equal ranks; duet's default least_cost keeps turns 2 and 3 on rank 1,
// whose cache holds the earlier prompts and the answers the client sent
// back, and the prefill engine sends only the KV beyond the decode's match
// (duet-sim's records: transferred_tokens = prompt - decode_prefix_len).
func TestDecodeCacheKeepsTheConversation(t *testing.T) {
	for _, tt := range []struct {
		name, decodePolicy string
		cached             bool // turns 2 and 3 stay on turn 1's rank
	}{
		{"least_cost", "least_cost", true},
		{"decode by load (control)", "{name: least_cost, ignore_decode_cache: true}", false},
	} {
		// The decode reports cached_tokens as SGLang did before its fix
		// (prefill and decode hits added: more than the prompt); duet
		// reads prompt_tokens and completion_tokens only.
		decodeArgs := append([]string{"--disaggregation-decode-enable-radix-cache", "--sim-double-count-cached-tokens"}, decodeCacheSim...)
		t.Run(tt.name, func(t *testing.T) {
			s := startStack(t, harness.Options{
				Prefill:       []harness.SimSpec{{DPSize: 2, Args: decodeCacheSim}},
				Decode:        []harness.SimSpec{{DPSize: 2, Args: decodeArgs}},
				PrefillPolicy: "least_cost",
				DecodePolicy:  tt.decodePolicy,
				KVTimeout:     60 * time.Second, // model time: 6 s of wall time
			})
			decode := s.Decode[0]
			waitDecodeCacheDiscovered(t, s)

			// A long request takes rank 0 (two idle ranks: the first).
			ctx, stopLong := context.WithCancel(context.Background())
			defer stopLong()
			long := make(chan string, 1)
			go func() {
				body := `{"model":"sim-model","messages":[{"role":"user","content":"count to a large number"}],"max_tokens":20000,"seed":7}`
				resp, _, err := s.Send(ctx, "POST", "/v1/chat/completions", nil, []byte(body))
				if err == nil {
					long <- servedBy(resp)
				}
				close(long)
			}()
			waitForLoad(t, decode, 0)

			c := conversation{t: t, s: s, history: fmt.Sprintf(`{"role":"system","content":%q}`, strings.Repeat("You are a careful coding agent. ", 400))}
			first := c.turn(1, strings.Repeat("Here is the repository listing. ", 300))
			if first.rank != decode.Address+"/dp1" {
				t.Fatalf("turn 1 went to %s, want rank 1 (rank 0 was busy)", first.rank)
			}
			stopLong()
			<-long
			waitDecodeIdle(t, s)

			second := c.turn(2, strings.Repeat("The tests fail with this output. ", 60))
			third := c.turn(3, strings.Repeat("Now the build log says this. ", 60))
			t.Logf("turns: %+v, %+v, %+v", first, second, third)
			if !tt.cached {
				if second.rank != decode.Address+"/dp0" {
					t.Errorf("by load, turn 2 went to %s, want rank 0 (both idle: the first)", second.rank)
				}
				return
			}
			for i, turn := range []turnResult{second, third} {
				if turn.rank != first.rank {
					t.Errorf("turn %d went to %s, want %s, where its history is cached", i+2, turn.rank, first.rank)
				}
				// The decode matched the previous turns' prompts and answers;
				// the prefill sent only the rest.
				prev := []turnResult{first, second}[i]
				if got := turn.decodePrefix; got <= prev.prompt {
					t.Errorf("turn %d: decode_prefix_len %d, want more than turn %d's prompt (%d tokens) and answer", i+2, got, i+1, prev.prompt)
				}
				if turn.transferred != turn.prompt-turn.decodePrefix {
					t.Errorf("turn %d: prefill transferred %d tokens, want prompt %d - decode prefix %d", i+2, turn.transferred, turn.prompt, turn.decodePrefix)
				}
				if turn.reportedCached <= turn.prompt {
					t.Errorf("turn %d: cached_tokens %d, want the double count beyond prompt_tokens %d", i+2, turn.reportedCached, turn.prompt)
				}
			}
		})
	}
}

// conversation is a chat whose turns send back the engine's answers, as
// clients do.
type conversation struct {
	t       *testing.T
	s       *harness.Stack
	history string // JSON messages so far, comma-separated
}

// turnResult is what one turn showed: the decode target that served it,
// and the legs' records (tokens as the simulator counts them).
type turnResult struct {
	rank                              string
	prompt, decodePrefix, transferred int
	// reportedCached is usage.prompt_tokens_details.cached_tokens.
	reportedCached int
}

// turn sends user as turn i, with a seed (the engine's answer is then a
// function of it) and waits for both legs' records.
func (c *conversation) turn(i int, user string) turnResult {
	t := c.t
	t.Helper()
	c.history += fmt.Sprintf(`,{"role":"user","content":%q}`, user)
	id := requestID(t, i)
	body := fmt.Sprintf(`{"model":"sim-model","messages":[%s],"max_tokens":40,"seed":%d}`, c.history, 100+i)
	resp, out := send(t, c.s, "POST", "/v1/chat/completions", map[string]string{"x-request-id": id}, []byte(body))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("turn %d: status %d: %s", i, resp.StatusCode, out)
	}
	answer := gjson.GetBytes(out, "choices.0.message.content").String()
	if answer == "" {
		t.Fatalf("turn %d: no answer in %s", i, out)
	}
	c.history += fmt.Sprintf(`,{"role":"assistant","content":%q}`, answer)
	res := turnResult{rank: servedBy(resp)}
	_, dec := only(t, legs(t, c.s.Decode, id, 1))
	_, pre := only(t, legs(t, c.s.Prefill, id, 1))
	if len(dec.DecodePrefixLen) != 1 {
		t.Fatalf("turn %d: the decode record has no decode_prefix_len: %+v", i, dec)
	}
	res.decodePrefix = dec.DecodePrefixLen[0]
	res.prompt = int(gjson.GetBytes(out, "usage.prompt_tokens").Int())
	res.reportedCached = int(gjson.GetBytes(out, "usage.prompt_tokens_details.cached_tokens").Int())
	if len(pre.TransferredTokens) == 1 {
		res.transferred = pre.TransferredTokens[0]
	} else {
		res.transferred = res.prompt // the prefill got no prefix: it sent everything
	}
	return res
}

// waitDecodeCacheDiscovered waits until duet's status shows the decode
// engine's decode radix cache.
func waitDecodeCacheDiscovered(t *testing.T, s *harness.Stack) {
	t.Helper()
	waitStatus(t, s, "the decode radix cache discovered", func(st []byte) bool {
		return gjson.GetBytes(st, `endpoints.#(role=="decode").decode_cache`).String() == "radix"
	})
}

// waitDecodeIdle waits until duet sees no load on any decode rank: the
// long request's abort and turn 1's end reported and scraped.
func waitDecodeIdle(t *testing.T, s *harness.Stack) {
	t.Helper()
	waitStatus(t, s, "idle decode ranks", func(st []byte) bool {
		ranks := gjson.GetBytes(st, `endpoints.#(role=="decode").ranks`).Array()
		for _, r := range ranks {
			if r.Get("tokens").Int() != 0 || !r.Get("load_fresh").Bool() {
				return false
			}
		}
		return len(ranks) == 2
	})
}

// waitStatus polls duet's /status.json until ok accepts it.
func waitStatus(t *testing.T, s *harness.Stack, what string, ok func([]byte) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var last []byte
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.DuetAdminURL + "/status.json")
		if err == nil {
			last, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if json.Valid(last) && ok(last) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("waiting for %s: last /status.json: %s", what, last)
}
