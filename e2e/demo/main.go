// Command demo brings up the local stack (a real Envoy, duet with its
// default policies, two prefill and two decode simulated SGLang engines,
// each with two DP ranks and duet-sim's engine model: the topology of
// harness.DemoOptions, which deploy/compose runs too). It then plays three
// multi-turn conversations through Envoy (package conversations) and prints,
// per turn, the (engine, DP rank) that served its prefill and its decode and
// the prompt tokens the engines found cached; then a few other request
// shapes, streaming and not, with where each leg went. Run it with `make
// demo`; -hold keeps the stack up for your own requests until Ctrl-C.
//
// The stack's configuration, credentials (keys and tokens) and logs live in
// a temporary directory that the demo removes when it ends, on Ctrl-C
// (SIGINT) or SIGTERM too; -keep keeps it. Interrupted, the demo stops the
// stack and exits with status 0.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/duet-router/duet/e2e/demo/conversations"
	"github.com/duet-router/duet/e2e/harness"
)

func main() {
	hold := flag.Bool("hold", false, "keep the stack running until interrupted")
	keep := flag.Bool("keep", false, "keep the temporary directory (configuration, credentials, logs) after the demo ends")
	flag.Parse()
	os.Exit(demo(os.Stdout, os.Stderr, *keep, func(ctx context.Context, dir string) error {
		return run(ctx, dir, *hold, *keep)
	}))
}

// demo runs body in a new temporary directory until body returns, or
// SIGINT or SIGTERM ends its context; then it removes the directory
// unless keep. It returns the exit status: 0 when body succeeded or was
// interrupted, 1 when it failed or the directory could not be removed.
func demo(stdout, stderr io.Writer, keep bool, body func(ctx context.Context, dir string) error) int {
	// Until demo returns, a second Ctrl-C is caught too, so that the
	// cleanup still removes the directory with the keys.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "duet-demo-")
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	code := 0
	err = body(ctx, dir)
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(stdout, "\nInterrupted: the stack is stopped.")
	case err != nil:
		fmt.Fprintln(stderr, "demo:", err)
		code = 1
	}
	if keep {
		fmt.Fprintf(stdout, "Kept %s (configuration, credentials, logs).\n", dir)
		return code
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(stderr, "demo: remove the temporary directory:", err)
		return 1
	}
	return code
}

// run starts the demo's stack in dir, sends its traffic and, with hold,
// keeps the stack up until ctx ends. It stops the stack before it returns;
// when it fails (but for an interruption) it prints the tail of every
// process's log first.
func run(ctx context.Context, dir string, hold, keep bool) (err error) {
	opts := harness.DemoOptions()
	opts.Dir = dir
	fmt.Printf("Starting Envoy + duet + %d prefill + %d decode simulated SGLang engines ...\n", len(opts.Prefill), len(opts.Decode))
	s, err := harness.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && ctx.Err() == nil {
			fmt.Fprint(os.Stderr, s.Logs())
			if !keep {
				fmt.Fprintln(os.Stderr, "(the demo removes these logs when it ends; make demo KEEP=1 keeps them)")
			}
		}
		s.Close()
	}()
	if err := banner(ctx, s, opts, keep); err != nil {
		return err
	}
	if err := chats(ctx, s); err != nil {
		return err
	}
	if err := shapes(ctx, s); err != nil {
		return err
	}
	if hold {
		fmt.Printf("\nThe stack is up. Try:\n  curl -s %s/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{\"model\":\"sim-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}'\nand watch %s/status. Ctrl-C stops it.\n", s.EnvoyURL, s.DuetAdminURL)
		<-ctx.Done()
	}
	return nil
}

// statusPage says where duet's status page is and what opens it: nothing
// when duet's admin port listens on loopback only, else the admin token
// (the file's, and the token itself, which the demo made).
func statusPage(adminURL string, beyondLoopback bool, c harness.Credentials) string {
	if !beyondLoopback {
		return adminURL + "/status (duet's live view; the admin port listens on loopback: no token needed)"
	}
	return fmt.Sprintf("%s/status (duet's live view; give the admin token %s, from %s, as the password, or as \"Authorization: Bearer\")",
		adminURL, c.AdminToken, c.AdminTokenFile)
}

// bufferLimitRE is the body limit in Envoy's bootstrap, which `duet
// envoy-config` sets to duet's request.max_body_bytes.
var bufferLimitRE = regexp.MustCompile(`per_connection_buffer_limit_bytes: (\d+)`)

// bodyLimit says how large a request body the stack takes, from the
// bootstrap at path: duet's request.max_body_bytes.
func bodyLimit(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "unknown: " + err.Error()
	}
	m := bufferLimitRE.FindSubmatch(data)
	if m == nil {
		return "unknown: the bootstrap sets no per_connection_buffer_limit_bytes"
	}
	n, _ := strconv.Atoi(string(m[1]))
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// banner prints the stack's parts and duet's policies.
func banner(ctx context.Context, s *harness.Stack, opts harness.Options, keep bool) error {
	version, _ := s.Tools.EnvoyVersion()
	policies, err := conversations.Policies(ctx, s)
	if err != nil {
		return err
	}
	caches, err := conversations.DecodeCaches(ctx, s)
	if err != nil {
		return err
	}
	line := func(label, format string, args ...any) {
		fmt.Printf("  %-14s%s\n", label, fmt.Sprintf(format, args...))
	}
	line("Envoy "+version, "%s", s.EnvoyURL)
	line("status page", "%s", statusPage(s.DuetAdminURL, opts.AdminAllInterfaces, s.Credentials))
	line("duet admin", "%s/metrics, /readyz", s.DuetAdminURL)
	line("body limit", "%s: duet's default request.max_body_bytes (the demo sets no request section)", bodyLimit(s.EnvoyConfig))
	line("duet policies", "prefill %s, decode %s: duet's defaults (the demo's configuration sets none)", policies["prefill"], policies["decode"])
	for i, sim := range s.Prefill {
		line(fmt.Sprintf("prefill-%d", i), "%s dp %d (bootstrap port %d)", sim.Address, sim.DPSize, sim.BootstrapPort)
	}
	for i, sim := range s.Decode {
		cache := "?"
		if i < len(caches) {
			cache = caches[i]
		}
		line(fmt.Sprintf("decode-%d", i), "%s dp %d (decode cache %s)", sim.Address, sim.DPSize, cache)
	}
	line("engines", "duet-sim %s: every DP rank has its own prefix cache", strings.Join(opts.Prefill[0].Args, " "))
	line("Envoy->duet", "%s (credentials from `duet certs` in %s)", opts.Auth, s.Credentials.Dir)
	removed := "removed when the demo ends; make demo KEEP=1 keeps it"
	if keep {
		removed = "kept when the demo ends"
	}
	line("logs", "%s (duet.yaml, duet.log, envoy.yaml, envoy.log with Envoy's access log and health-check events, ...; %s)", s.Dir, removed)
	return nil
}

// chats plays the demo's conversations and prints each turn.
func chats(ctx context.Context, s *harness.Stack) error {
	convs := conversations.Demo()
	fmt.Printf("\n%d conversations of %d turns; each turn resends the whole history plus a new user message,\n", len(convs), len(convs[0].Users))
	fmt.Printf("as an OpenAI client does. The first turns arrive together, the later ones one at a time.\n\n")
	fmt.Printf("%-12s %4s %7s %7s   %-15s %s\n", "conversation", "turn", "prompt", "cached", "prefill", "decode")
	turns, err := conversations.Play(ctx, s, convs, func(t conversations.Turn) {
		cached := "-"
		if t.CachedTokens >= 0 {
			cached = fmt.Sprint(t.CachedTokens)
		}
		fmt.Printf("%-12s %4d %7d %7s   %-15s %s\n", t.Conversation, t.Index, t.PromptTokens, cached, t.Prefill, t.Decode)
	})
	if err != nil {
		return err
	}
	if err := conversations.Check(turns); err != nil {
		return fmt.Errorf("the conversations did not keep their ranks:\n%w", err)
	}
	fmt.Print(`
prompt and cached are the engines' usage (prompt_tokens, prompt_tokens_details.cached_tokens).
Each conversation stays on one prefill rank and one decode rank from its first turn on: their caches
hold its history, so each later turn computes and transfers only what is new. That is least_cost,
duet's default policy on both roles: it prices each rank by the work the request adds there, and
cached tokens are work saved. A first turn matches no cache, so it goes to the rank whose cache holds
the least (prefill) and to the least loaded rank (decode): the conversations, started together, got
different ranks.
`)
	return nil
}

// shapes sends other request shapes, streaming and not, and prints where
// each leg went.
func shapes(ctx context.Context, s *harness.Stack) error {
	fmt.Printf("\nOther request shapes:\n")
	requests := []struct {
		name, path, body string
		stream           bool
	}{
		{"chat", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"What is PD disaggregation?"}],"max_tokens":12}`, false},
		{"chat stream", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"Stream a few tokens."}],"max_tokens":12,"stream":true}`, true},
		{"completions", "/v1/completions", `{"model":"sim-model","prompt":"Once upon a time","max_tokens":8}`, false},
		{"generate stream", "/generate", `{"text":"The quick brown fox","sampling_params":{"max_new_tokens":8},"stream":true}`, true},
		{"generate batch", "/generate", `{"text":["one","two"],"sampling_params":{"max_new_tokens":4}}`, false},
	}
	for i, r := range requests {
		id := fmt.Sprintf("demo-%d-%d", i, time.Now().UnixNano())
		if err := send(ctx, s, id, r.name, r.path, r.body, r.stream); err != nil {
			return err
		}
	}
	return nil
}

// send posts one request through Envoy and prints where each leg went.
func send(ctx context.Context, s *harness.Stack, id, name, path, body string, stream bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.EnvoyURL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-request-id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer resp.Body.Close()
	fmt.Printf("  %-16s POST %-21s -> %d  decode %s dp%s", name, path, resp.StatusCode,
		engineName(s, resp.Header.Get("X-Sim-Server")), resp.Header.Get("X-Sim-DP-Rank"))
	if stream {
		sc := bufio.NewScanner(resp.Body)
		events := 0
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				events++
			}
		}
		fmt.Printf(", streamed %d SSE events", events)
	} else if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	fmt.Println()
	prefill, err := prefillLeg(ctx, s, id)
	if err != nil {
		return err
	}
	fmt.Printf("%19sprefill %s\n", "", prefill)
	return nil
}

// engineName names the engine at address by role and position, e.g.
// decode-1, as the demo's banner lists them.
func engineName(s *harness.Stack, address string) string {
	for role, sims := range map[string][]*harness.Sim{"prefill": s.Prefill, "decode": s.Decode} {
		for i, sim := range sims {
			if sim.Address == address {
				return fmt.Sprintf("%s-%d", role, i)
			}
		}
	}
	return address
}

// prefillLeg describes the mirrored prefill leg of request id, as the
// prefill engine recorded it.
func prefillLeg(ctx context.Context, s *harness.Stack, id string) (string, error) {
	found, err := harness.WaitRecords(ctx, s.Prefill, id, 1, 5*time.Second)
	if err != nil {
		return "", fmt.Errorf("the prefill leg of %s: %w", id, err)
	}
	sim, r, err := harness.OnlyRecord(found)
	if err != nil {
		return "", fmt.Errorf("the prefill leg of %s: %w", id, err)
	}
	rank := "-"
	if r.DPRank != nil {
		rank = fmt.Sprint(*r.DPRank)
	}
	var rooms []string
	for _, room := range r.Rooms() {
		rooms = append(rooms, fmt.Sprintf("%d (room %% %d = %d)", room, sim.DPSize, room%uint64(sim.DPSize)))
	}
	return fmt.Sprintf("%s dp%s (rank from %s), bootstrap_room %s", engineName(s, sim.Address), rank, r.Source(), strings.Join(rooms, ", ")), nil
}
