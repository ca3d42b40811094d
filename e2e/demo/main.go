// Command demo brings up the local stack (a real Envoy, duet, two prefill
// and two decode simulated SGLang engines, each with two DP ranks: the
// topology of harness.DemoOptions, which deploy/compose runs too), sends
// streaming and non-streaming requests through Envoy, and prints which
// (engine, DP rank) served each leg. Run it with `make demo`; -hold keeps the
// stack up for your own requests until Ctrl-C.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

func main() {
	hold := flag.Bool("hold", false, "keep the stack running until interrupted")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, hold bool) error {
	opts := harness.DemoOptions()
	fmt.Printf("Starting Envoy + duet + %d prefill + %d decode simulated SGLang engines ...\n", len(opts.Prefill), len(opts.Decode))
	s, err := harness.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer s.Close()
	version, _ := s.Tools.EnvoyVersion()
	fmt.Printf("  Envoy %s   %s\n  duet admin   %s/metrics\n", version, s.EnvoyURL, s.DuetAdminURL)
	for _, sim := range s.Prefill {
		fmt.Printf("  prefill      %s dp %d (bootstrap port %d)\n", sim.Address, sim.DPSize, sim.BootstrapPort)
	}
	for _, sim := range s.Decode {
		fmt.Printf("  decode       %s dp %d\n", sim.Address, sim.DPSize)
	}
	fmt.Printf("  Envoy->duet  %s (credentials from `duet certs` in %s)\n", opts.Auth, s.Credentials.Dir)
	fmt.Printf("  logs         %s\n\n", s.Dir)

	requests := []struct {
		name, path, body string
		stream           bool
	}{
		{"chat", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"What is PD disaggregation?"}],"max_tokens":12}`, false},
		{"chat", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"And DP attention?"}],"max_tokens":12}`, false},
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

	if hold {
		fmt.Printf("\nThe stack is up. Try:\n  curl -s %s/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{\"model\":\"sim-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}'\nCtrl-C stops it.\n", s.EnvoyURL)
		<-ctx.Done()
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
	fmt.Printf("%-16s POST %-21s -> %d  decode %s dp%s", name, path, resp.StatusCode,
		resp.Header.Get("X-Sim-Server"), resp.Header.Get("X-Sim-DP-Rank"))
	if stream {
		fmt.Print("\n                 streamed:")
		sc := bufio.NewScanner(resp.Body)
		events := 0
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "data: ") {
				events++
				fmt.Print(" .")
			}
		}
		fmt.Printf(" (%d SSE events)", events)
	} else if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	fmt.Println()
	prefill, err := prefillLeg(ctx, s, id)
	if err != nil {
		return err
	}
	fmt.Printf("                 prefill %s\n", prefill)
	return nil
}

// prefillLeg describes the mirrored prefill leg of request id, as the
// prefill engine recorded it.
func prefillLeg(ctx context.Context, s *harness.Stack, id string) (string, error) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, sim := range s.Prefill {
			recs, err := sim.Requests(ctx)
			if err != nil {
				return "", err
			}
			for _, r := range recs {
				if r.RequestID() != id {
					continue
				}
				rank := "-"
				if r.DPRank != nil {
					rank = fmt.Sprint(*r.DPRank)
				}
				var rooms bytes.Buffer
				for i, room := range r.Rooms() {
					if i > 0 {
						rooms.WriteString(",")
					}
					fmt.Fprintf(&rooms, "%d (room %% %d = %d)", room, sim.DPSize, room%uint64(sim.DPSize))
				}
				return fmt.Sprintf("%s dp%s (rank from %s)  bootstrap_room %s", sim.Address, rank, r.Source(), rooms.String()), nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "", errors.New("the prefill leg of " + id + " was not recorded")
}
