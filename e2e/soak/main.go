// Command soak runs mixed load through the real Envoy and duet into
// simulated SGLang engines for a long time (20 minutes by default) while
// faults are injected on a fixed schedule, and reports requests and errors
// by outcome, wait percentiles, and duet's memory and goroutines over time.
// `make soak` runs it; it is not part of `make test`.
//
// Faults, cycling every -cycle: a decode engine killed and restarted, a
// prefill engine failing 30% of its requests, a prefill engine hanging, and
// every engine's /v1/loads answering garbage. A healthy run has no lost
// request, flat memory and goroutines, and, within -settle of the load's
// end, no tokens reserved on any live replica.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/duet-router/duet/e2e/harness"
)

func main() {
	duration := flag.Duration("duration", 20*time.Minute, "how long to run the load")
	rate := flag.Float64("rate", 40, "requests per second (open loop)")
	cycle := flag.Duration("cycle", 2*time.Minute, "period of the fault schedule")
	replicas := flag.Int("replicas", 1, "duet replicas; above 1 they share state through a nats-server (make nats-server), "+
		"and the fault schedule also kills the last replica and NATS")
	settle := flag.Duration("settle", 30*time.Second, "how long every live replica has, once the load ended, to release all its reserved tokens")
	var b bursts
	flag.Float64Var(&b.rate, "burst-rate", 0, "with a positive rate, bursts of long batch-class prompts on top of the load, at this many requests per second, "+
		"beyond what the engines (duet-sim's engine model, profile "+burstProfile+", 2 ranks each) can take: duet's admission queue holds them, serves the interactive load first and refuses the rest with 429")
	flag.DurationVar(&b.every, "burst-every", time.Minute, "period of the bursts")
	flag.DurationVar(&b.length, "burst-for", 20*time.Second, "length of each burst")
	flag.IntVar(&b.promptTokens, "burst-prompt-tokens", 8000, "prompt length of the burst's requests, in tokens")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *duration, *rate, *cycle, *replicas, *settle, b); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// sample is duet's process state at one time.
type sample struct {
	at                     time.Duration
	heapMiB, rssMiB        float64
	goroutines, legs, resv float64
}

// bursts are the soak's overload: long batch-class prompts at rate for
// length, every every.
type bursts struct {
	rate          float64
	every, length time.Duration
	promptTokens  int
}

// burstProfile is the engines' duet-sim profile when the soak bursts.
const burstProfile = "dsv3-dp8-h100-node"

// API keys of the soak's classes (admissionYAML maps their hashes).
const (
	keyInteractive = "sk-interactive"
	keyBatch       = "sk-batch"
)

// admissionYAML gives the base load (keyInteractive) a class above the
// bursts' (every other key, the default class).
const admissionYAML = `admission:
  classes:
  - {name: interactive, priority: 10, wait_limit: 10s}
  - {name: batch, priority: 0, wait_limit: 5s}
  default_class: batch
  api_keys: {7645b28b5463faac017baeb9c4aac66f80fda3eca4247f3f7838053082d5f6df: interactive}
`

func run(ctx context.Context, duration time.Duration, rate float64, cycle time.Duration, replicas int, settle time.Duration, b bursts) error {
	opts := harness.Options{
		Prefill:      []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		Decode:       []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		KVTimeout:    60 * time.Second,
		LogLevel:     "warn",
		DuetYAML:     "health:\n  interval: 500ms\n  timeout: 500ms\n",
		DuetReplicas: replicas,
	}
	if b.rate > 0 {
		// Engines with queues (the calibrated engine model, 2 ranks each),
		// so that the bursts overload them as they would real engines.
		for _, specs := range [][]harness.SimSpec{opts.Prefill, opts.Decode} {
			for i := range specs {
				specs[i].Args = []string{"--profile", burstProfile}
			}
		}
		opts.DuetYAML += admissionYAML
	}
	var nats *harness.NATS
	if replicas > 1 {
		dir, err := os.MkdirTemp("", "duet-soak-nats-")
		if err != nil {
			return err
		}
		if nats, err = harness.StartNATS(ctx, dir); err != nil {
			return err
		}
		defer nats.Stop(time.Second)
		opts.DuetYAML += "sync:\n  nats:\n    url: " + nats.URL + "\n"
	}
	s, err := harness.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Printf("soak: %v at %.0f req/s, faults every %v; logs in %s\n", duration, rate, cycle, s.Dir)

	client := &http.Client{Timeout: 30 * time.Second}
	var (
		mu      sync.Mutex
		results []harness.Result
		samples []sample
		wg      sync.WaitGroup
	)
	start := time.Now()
	record := func() {
		if smp, err := scrape(s.DuetAdminURL); err == nil {
			smp.at = time.Since(start).Round(time.Second)
			mu.Lock()
			samples = append(samples, smp)
			mu.Unlock()
		}
	}
	record()

	loadCtx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	go faults(loadCtx, s, nats, cycle)
	go func() {
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
				record()
			}
		}
	}()
	var burstResults []harness.Result
	if b.rate > 0 {
		wg.Go(func() {
			out := burst(loadCtx, client, s.EnvoyURL, b)
			mu.Lock()
			burstResults = out
			mu.Unlock()
		})
	}
	interval := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for i := 0; loadCtx.Err() == nil; i++ {
		next = next.Add(interval)
		time.Sleep(time.Until(next))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := harness.ChatWith(context.Background(), client, s.EnvoyURL, i, i%2 == 1, 16+i%48, harness.ChatExtra{APIKey: keyInteractive})
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		}()
	}
	wg.Wait()
	time.Sleep(3 * time.Second) // let feedback and aborts settle
	reserved, settled := settleReserved(ctx, s, settle)
	record()
	report(os.Stdout, results, samples)
	if b.rate > 0 {
		fmt.Printf("\nbursts (batch class, %d-token prompts at %.0f req/s for %v every %v):\n", b.promptTokens, b.rate, b.length, b.every)
		report(os.Stdout, burstResults, nil)
		fmt.Printf("\nadmission: refused %s\n", refusals(s))
		results = append(results, burstResults...)
	}
	if replicas > 1 {
		fmt.Println("\n| replica | untrusted entries | adopted entries | sync events dropped | reserved tokens |")
		fmt.Println("|---|---|---|---|---|")
		for i := range s.Duets {
			fmt.Printf("| %d | %.0f | %.0f | %.0f | %.0f |\n", i, s.ReplicaMetric(i, "duet_feedback_untrusted_total", nil),
				s.ReplicaMetric(i, "duet_feedback_adopted_total", nil), s.ReplicaMetric(i, "duet_sync_events_dropped_total", nil),
				reserved[i])
		}
	}
	fmt.Printf("\nreserved tokens after the load (-1: replica down), waited %v of %v: %v\n", settled.Round(time.Millisecond), settle, reserved)
	lost := 0
	for _, r := range results {
		if r.Outcome == harness.OutcomeLost {
			lost++
			fmt.Printf("lost: x-request-id %s after %v: %.300s\n", r.ID, r.Wait.Round(time.Millisecond), r.Detail)
		}
	}
	if lost > 0 {
		return fmt.Errorf("%d requests lost", lost)
	}
	if held := heldReplicas(reserved); len(held) > 0 {
		return fmt.Errorf("replicas %v still hold reserved tokens %v after %v: a reservation outlived its request", held, reserved, settle)
	}
	return nil
}

// reservedTokens returns every replica's reserved tokens, -1 for a replica
// that does not answer.
func reservedTokens(s *harness.Stack) []float64 {
	out := make([]float64, len(s.Duets))
	for i := range s.Duets {
		out[i] = s.ReplicaMetric(i, "duet_target_tokens", map[string]string{"kind": "reserved"})
	}
	return out
}

// heldReplicas lists the replicas that answer and still hold tokens.
func heldReplicas(reserved []float64) []int {
	var held []int
	for i, r := range reserved {
		if r > 0 {
			held = append(held, i)
		}
	}
	return held
}

// settleReserved polls every replica's reserved tokens until none that
// answers holds any, for at most within, and returns the last reading and
// how long it waited. Once every request ended, a decode hold ends at the
// next covering scrape and a prefill hold with its leg's feedback.
func settleReserved(ctx context.Context, s *harness.Stack, within time.Duration) ([]float64, time.Duration) {
	start := time.Now()
	deadline := start.Add(within)
	for {
		reserved := reservedTokens(s)
		if len(heldReplicas(reserved)) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return reserved, time.Since(start)
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// faults injects one fault per cycle/4 (cycle/6 with replicas sharing
// through nats), in turn, until ctx ends.
func faults(ctx context.Context, s *harness.Stack, nats *harness.NATS, cycle time.Duration) {
	kinds := 4
	if nats != nil {
		kinds = 6
	}
	step := cycle / time.Duration(kinds)
	post := func(sim *harness.Sim, body string) {
		if resp, err := http.Post(sim.URL+"/sim/faults", "application/json", strings.NewReader(body)); err == nil {
			resp.Body.Close()
		}
	}
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	for n := 0; ; n++ {
		if !wait(step / 2) {
			return
		}
		switch n % kinds {
		case 0:
			fmt.Println("fault: decode-1 killed")
			s.Decode[1].Kill()
			if !wait(step / 4) {
				_ = s.Decode[1].Restart(context.Background())
				return
			}
			_ = s.Decode[1].Restart(context.Background())
		case 1:
			fmt.Println("fault: prefill-1 fails 30% of requests")
			post(s.Prefill[1], `{"error_rate":0.3}`)
			wait(step / 4)
			post(s.Prefill[1], `{"error_rate":0}`)
		case 2:
			fmt.Println("fault: prefill-1 hangs")
			post(s.Prefill[1], `{"hang":true}`)
			wait(step / 4)
			post(s.Prefill[1], `{"hang":false}`)
		case 3:
			fmt.Println("fault: every /v1/loads answers garbage")
			for _, sim := range append(append([]*harness.Sim{}, s.Prefill...), s.Decode...) {
				post(sim, `{"loads":"garbage"}`)
			}
			wait(step / 4)
			for _, sim := range append(append([]*harness.Sim{}, s.Prefill...), s.Decode...) {
				post(sim, `{"loads":"ok"}`)
			}
		case 4:
			last := len(s.Duets) - 1
			fmt.Printf("fault: duet replica %d killed\n", last)
			s.Duets[last].Kill()
			wait(step / 4)
			_ = s.RestartReplica(context.Background(), last)
		case 5:
			fmt.Println("fault: NATS killed")
			nats.Kill()
			wait(step / 4)
			if err := nats.Restart(); err == nil {
				_ = nats.WaitReady(context.Background())
			}
		}
		if !wait(step / 4) {
			return
		}
	}
}

// scrape reads duet's memory, goroutines, tracked legs and reservations.
func scrape(adminURL string) (sample, error) {
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		return sample{}, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return sample{}, err
	}
	value := func(name string) float64 {
		sum := 0.0
		for _, m := range mfs[name].GetMetric() {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		return sum
	}
	return sample{
		heapMiB:    value("go_memstats_heap_alloc_bytes") / (1 << 20),
		rssMiB:     value("process_resident_memory_bytes") / (1 << 20),
		goroutines: value("go_goroutines"),
		legs:       value("duet_legs_tracked"),
		resv:       value("duet_reservations"),
	}, nil
}

// report prints the outcome counts, wait percentiles and duet's samples.
func report(w io.Writer, results []harness.Result, samples []sample) {
	counts := map[harness.Outcome]int{}
	var waits []time.Duration
	worst := map[harness.Outcome]time.Duration{}
	for _, r := range results {
		counts[r.Outcome]++
		waits = append(waits, r.Wait)
		worst[r.Outcome] = max(worst[r.Outcome], r.Wait)
	}
	slices.Sort(waits)
	pct := func(p float64) time.Duration {
		if len(waits) == 0 {
			return 0
		}
		return waits[min(len(waits)-1, int(p*float64(len(waits))))]
	}
	fmt.Fprintf(w, "\nrequests %d   wait p50 %v  p99 %v  max %v\n", len(results),
		pct(0.50).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), pct(1).Round(time.Millisecond))
	fmt.Fprintln(w, "| outcome | requests | worst wait |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, o := range harness.Outcomes {
		fmt.Fprintf(w, "| %s | %d | %v |\n", o, counts[o], worst[o].Round(time.Millisecond))
	}
	if len(samples) == 0 {
		return
	}
	fmt.Fprintln(w, "\n| at | duet heap MiB | duet RSS MiB | goroutines | legs tracked | reservations |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, s := range samples {
		fmt.Fprintf(w, "| %v | %.1f | %.1f | %.0f | %.0f | %.0f |\n", s.at, s.heapMiB, s.rssMiB, s.goroutines, s.legs, s.resv)
	}
}

// burst sends b's requests until ctx ends and returns their results.
func burst(ctx context.Context, client *http.Client, url string, b bursts) []harness.Result {
	var (
		mu  sync.Mutex
		out []harness.Result
		wg  sync.WaitGroup
	)
	interval := time.Duration(float64(time.Second) / b.rate)
	for start := time.Now(); ctx.Err() == nil; start = start.Add(b.every) {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(b.every - b.length))):
		}
		end := time.Now().Add(b.length)
		for i := 0; ctx.Err() == nil && time.Now().Before(end); i++ {
			wg.Go(func() {
				r := harness.ChatWith(context.Background(), client, url, 1_000_000+i, false, 16, harness.ChatExtra{APIKey: keyBatch, PromptTokens: b.promptTokens})
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
			})
			time.Sleep(interval)
		}
	}
	wg.Wait()
	return out
}

// refusals sums every replica's admission refusals by class and reason.
func refusals(s *harness.Stack) string {
	var parts []string
	for _, class := range []string{"interactive", "batch"} {
		for _, reason := range []string{"wait_limit", "queue_full", "shed"} {
			n := 0.0
			for i := range s.Duets {
				n += max(s.ReplicaMetric(i, "duet_admission_requests_total", map[string]string{"class": class, "outcome": reason}), 0)
			}
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%s %s %.0f", class, reason, n))
			}
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
