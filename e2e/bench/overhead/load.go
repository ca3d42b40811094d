package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/duet-router/duet/e2e/bench"
)

// The APIs a case can send to.
const (
	apiChat     = "chat"     // POST /v1/chat/completions
	apiGenerate = "generate" // POST /generate (SGLang's native API)
)

// loadCase is one load: a body size, an API, streamed or not, and either a
// fixed rate (open loop) or a number of workers sending back to back
// (closed loop, saturation).
type loadCase struct {
	// bodyBytes is the size of the request body.
	bodyBytes int
	// api is apiChat or apiGenerate.
	api string
	// stream asks for a streamed (SSE) answer.
	stream bool
	// rate is the open-loop rate in requests per second; 0 means closed
	// loop with workers.
	rate int
	// workers is the closed loop's concurrency.
	workers int
}

// String names the case, e.g. "32 KiB, 200 rps", "1 KiB, concurrency 20"
// or "32 KiB /generate streamed, 500 rps".
func (c loadCase) String() string {
	name := sizeName(c.bodyBytes)
	if c.api == apiGenerate {
		name += " /generate"
	}
	if c.stream {
		name += " streamed"
	}
	if c.rate > 0 {
		return fmt.Sprintf("%s, %d rps", name, c.rate)
	}
	return fmt.Sprintf("%s, concurrency %d", name, c.workers)
}

// path is the case's request path.
func (c loadCase) path() string {
	if c.api == apiGenerate {
		return "/generate"
	}
	return "/v1/chat/completions"
}

// sizeName writes a byte count in KiB, e.g. "32 KiB".
func sizeName(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}

// counterDigits is the width of the request number written into every
// body, so that no two requests carry the same prompt.
const counterDigits = 12

// requestBody returns c's request body, of exactly c.bodyBytes bytes (or
// the smallest one, if that is below it), asking for one token, its prompt
// padded with text; and the offset of the prompt's first byte, where
// distinct writes each request's number.
func requestBody(c loadCase) ([]byte, int) {
	var head, tail string
	switch c.api {
	case apiGenerate:
		head = fmt.Sprintf(`{"sampling_params":{"max_new_tokens":1},"stream":%t,"text":"`, c.stream)
		tail = `"}`
	default:
		head = fmt.Sprintf(`{"model":"sim-model","max_tokens":1,"stream":%t,"messages":[{"role":"user","content":"`, c.stream)
		tail = `"}]}`
	}
	const words = "the quick brown fox jumps over the lazy dog "
	pad := max(c.bodyBytes-len(head)-len(tail), counterDigits)
	var b strings.Builder
	b.Grow(len(head) + pad + len(tail))
	b.WriteString(head)
	for b.Len() < len(head)+pad {
		b.WriteString(words[:min(len(words), len(head)+pad-b.Len())])
	}
	b.WriteString(tail)
	return []byte(b.String()), len(head)
}

// distinct returns a targeter of c's requests to base: each body is body
// with the request's number written at at, so that every prompt is new to
// duet's prefix index (and SMG's), as distinct users' prompts are.
func distinct(base string, c loadCase, body []byte, at int) vegeta.Targeter {
	var n atomic.Uint64
	header := http.Header{"Content-Type": {"application/json"}}
	url := base + c.path()
	return func(t *vegeta.Target) error {
		b := bytes.Clone(body)
		copy(b[at:], fmt.Sprintf("%0*d", counterDigits, n.Add(1)))
		t.Method, t.URL, t.Body, t.Header = "POST", url, b, header
		return nil
	}
}

// sample is what one measurement saw.
type sample struct {
	// latencies are every answered or failed request's, in ms;
	// errLatencies those of the non-2xx answers and transport errors.
	latencies, errLatencies []float64
	// ok counts 2xx answers; codes counts the other statuses (0: no
	// answer: a transport error or timeout).
	ok    int
	codes map[int]int
	// firstError is the first transport error, if any.
	firstError string
	// sendSpan is the time from the first request sent to the last; wall
	// from the first request to the last answer.
	sendSpan, wall time.Duration
	// loadBusy and serverBusy are the busy shares of the load generator's
	// and the servers' CPUs while it ran (-1: unknown).
	loadBusy, serverBusy float64
	// cpuPerReq is each role's CPU time per request sent, µs (nil:
	// unknown).
	cpuPerReq map[string]float64
}

// stats summarize a sample.
type stats struct {
	P50, P90, P99, P999 float64 // latency, ms
	Sent, OK            int
	// Rate is the achieved sending rate (over the sending span) and
	// Throughput the 2xx answers per second (over the wall time).
	Rate, Throughput float64
	// LoadCPU and ServerCPU are the busy shares of the load generator's
	// and the servers' CPUs (-1: unknown).
	LoadCPU, ServerCPU float64
	// CPUPerReq is each role's (roleProxy, roleProcessor, roleEngines) CPU
	// time per request sent, µs; absent roles are not in the variant.
	CPUPerReq map[string]float64
	// Errors counts non-2xx answers and transport errors; Codes lists
	// them, e.g. "503×3 err×1"; ErrP50 is their median latency (ms), which
	// tells a shed request (answered at once) from one that timed out.
	Errors int
	Codes  string
	ErrP50 float64
}

// summarize computes a sample's stats.
func summarize(s sample) stats {
	sorted := slices.Clone(s.latencies)
	slices.Sort(sorted)
	st := stats{
		P50: bench.Percentile(sorted, 50), P90: bench.Percentile(sorted, 90),
		P99: bench.Percentile(sorted, 99), P999: bench.Percentile(sorted, 99.9),
		Sent: len(s.latencies), OK: s.ok, LoadCPU: s.loadBusy, ServerCPU: s.serverBusy,
		CPUPerReq: s.cpuPerReq,
	}
	if secs := s.sendSpan.Seconds(); secs > 0 && st.Sent > 1 {
		// n requests sent at a steady rate span n-1 intervals.
		st.Rate = float64(st.Sent-1) / secs
	}
	if secs := s.wall.Seconds(); secs > 0 {
		st.Throughput = float64(st.OK) / secs
	}
	codes := make([]int, 0, len(s.codes))
	for c, n := range s.codes {
		st.Errors += n
		codes = append(codes, c)
	}
	slices.Sort(codes)
	var parts []string
	for _, c := range codes {
		name := fmt.Sprint(c)
		if c == 0 {
			name = "err"
		}
		parts = append(parts, fmt.Sprintf("%s×%d", name, s.codes[c]))
	}
	st.Codes = strings.Join(parts, " ")
	errSorted := slices.Clone(s.errLatencies)
	slices.Sort(errSorted)
	st.ErrP50 = bench.Percentile(errSorted, 50)
	return st
}

// newClient is the load generator's HTTP client: HTTP/1.1 keep-alive
// connections to loopback, a 10 s timeout, no redirects followed.
func newClient() *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: vegeta.DefaultConnections,
			DisableCompression:  true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// attack runs one vegeta attack of c's load on target through client.
func attack(ctx context.Context, client *http.Client, target vegeta.Targeter, c loadCase, d time.Duration, name string) <-chan *vegeta.Result {
	opts := []func(*vegeta.Attacker){vegeta.Client(client)}
	if c.rate == 0 {
		w := uint64(max(c.workers, 1))
		opts = append(opts, vegeta.Workers(w), vegeta.MaxWorkers(w))
	}
	atk := vegeta.NewAttacker(opts...)
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	results := atk.Attack(target, vegeta.Rate{Freq: c.rate, Per: time.Second}, d, name)
	out := make(chan *vegeta.Result)
	go func() {
		defer close(out)
		defer stop()
		for r := range results {
			out <- r
		}
	}()
	return out
}

// measure sends c's load to url with vegeta, every body distinct, for warmup (not recorded),
// then for duration, on the same connections (client), noting how busy the
// CPUs named loadCPU and serverCPU (as in /proc/stat, e.g. "cpu0"; empty:
// not noted) were meanwhile, and how much CPU time the processes in pids
// (by role) used per request.
func measure(ctx context.Context, client *http.Client, url string, c loadCase, warmup, duration time.Duration, loadCPU, serverCPU string, pids map[string][]int) (sample, error) {
	body, at := requestBody(c)
	target := distinct(url, c, body, at)
	if warmup > 0 {
		for range attack(ctx, client, target, c, warmup, "warmup") {
		}
	}
	if err := ctx.Err(); err != nil {
		return sample{}, fmt.Errorf("measure %s: %w", c, err)
	}
	s := sample{codes: map[int]int{}}
	var first, lastStart, last time.Time
	before, beforeRoles := readProcStat(), roleCPU(pids)
	for r := range attack(ctx, client, target, c, duration, c.String()) {
		if first.IsZero() || r.Timestamp.Before(first) {
			first = r.Timestamp
		}
		if r.Timestamp.After(lastStart) {
			lastStart = r.Timestamp
		}
		if end := r.End(); end.After(last) {
			last = end
		}
		s.latencies = append(s.latencies, float64(r.Latency)/float64(time.Millisecond))
		switch {
		case r.Code >= 200 && r.Code < 300:
			s.ok++
		default:
			s.codes[int(r.Code)]++
			s.errLatencies = append(s.errLatencies, float64(r.Latency)/float64(time.Millisecond))
			if r.Code == 0 && s.firstError == "" {
				s.firstError = r.Error
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return sample{}, fmt.Errorf("measure %s: %w", c, err)
	}
	after, afterRoles := readProcStat(), roleCPU(pids)
	s.cpuPerReq = cpuPerRequest(beforeRoles, afterRoles, len(s.latencies))
	s.loadBusy, s.serverBusy = busyShare(before, after, loadCPU), busyShare(before, after, serverCPU)
	s.sendSpan, s.wall = lastStart.Sub(first), last.Sub(first)
	return s, nil
}
