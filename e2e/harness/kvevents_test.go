package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Every engine gets a PUB and a replay range of its DP size, none
// overlapping another or the ports chosen while they are held; without
// KVEvents none.
func TestKVEventPorts(t *testing.T) {
	opts := Options{Prefill: []SimSpec{{DPSize: 2}, {DPSize: 4}}, Decode: []SimSpec{{}, {DPSize: 3}}, KVEvents: true}
	kv, held, err := kvEventPorts(opts)
	if err != nil {
		t.Fatal(err)
	}
	others, err := freePorts(20)
	held.release()
	if err != nil {
		t.Fatal(err)
	}
	if len(kv) != 4 {
		t.Fatalf("%d engines' ports, want 4", len(kv))
	}
	used := map[int]string{}
	for _, p := range others {
		used[p] = "freePorts"
	}
	for i, dp := range []int{2, 4, 1, 3} {
		for _, r := range []struct {
			name string
			base int
		}{{"pub", kv[i].pub}, {"replay", kv[i].replay}} {
			if r.base <= 0 {
				t.Fatalf("engine %d: %s port %d", i, r.name, r.base)
			}
			for p := r.base; p < r.base+dp; p++ {
				if by, ok := used[p]; ok {
					t.Fatalf("engine %d %s port %d also taken by %s", i, r.name, p, by)
				}
				used[p] = fmt.Sprintf("engine %d %s", i, r.name)
			}
		}
	}
	// Released: every port binds again.
	for p := range used {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d still held: %v", p, err)
		}
		l.Close()
	}
	opts.KVEvents = false
	if kv, _, err := kvEventPorts(opts); err != nil || len(kv) != 4 || slices.ContainsFunc(kv, func(p kvPorts) bool { return p != kvPorts{} }) {
		t.Fatalf("without KVEvents: %v, %v", kv, err)
	}
}

// An engine's flags carry its KV event endpoints and the tokenizer before
// its own flags, which can override them; SimArgs, without either option,
// is what it was.
func TestSimArgsKVEventsTokenizer(t *testing.T) {
	spec := SimSpec{DPSize: 2, Args: []string{"--profile", "dense-8b-h100"}}
	plain := SimArgs("prefill", spec, "127.0.0.1:1", 2, Options{})
	want := []string{"--mode", "prefill", "--listen", "127.0.0.1:1", "--dp-size", "2", "--bootstrap-port", "2",
		"--kv-timeout", "5s", "--decode-ms-per-token", "2", "--await-transfer", "--profile", "dense-8b-h100"}
	if !slices.Equal(plain, want) {
		t.Fatalf("SimArgs = %q, want %q", plain, want)
	}
	got := simArgs("decode", spec, "127.0.0.1:1", 2, kvPorts{pub: 5000, replay: 6000}, Options{SimTokenizer: "/tok/qwen3"})
	tail := []string{"--kv-events-config", `{"publisher":"zmq","endpoint":"tcp://*:5000","replay_endpoint":"tcp://*:6000"}`,
		"--tokenizer-path", "/tok/qwen3", "--profile", "dense-8b-h100"}
	if len(got) < len(tail) || !slices.Equal(got[len(got)-len(tail):], tail) {
		t.Fatalf("simArgs = %q, want it to end %q", got, tail)
	}
	var cfg map[string]string
	if err := json.Unmarshal([]byte(tail[1]), &cfg); err != nil || cfg["publisher"] != "zmq" {
		t.Fatalf("kv events config %q: %v", tail[1], err)
	}
}

// The CPU fields of /proc/<pid>/stat are read after the command name,
// which may hold spaces and parentheses; the test process's own is read.
func TestParseStatCPU(t *testing.T) {
	line := "4242 (duet (x) y) S 1 2 3 4 5 6 7 8 9 10 250 130 0 0 20 0 12 0 99 0 0"
	if got, err := parseStatCPU(line); err != nil || got != 3800*time.Millisecond {
		t.Fatalf("parseStatCPU = %s, %v; want 3.8s", got, err)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 u 130"} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q) accepted", bad)
		}
	}
	data, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	if _, err := parseStatCPU(string(data)); err != nil {
		t.Fatal(err)
	}
}

// A stack with KVEvents and SimTokenizer behind a real Envoy and duet
// (Qwen3's tokenizer, so kv_events mode auto follows the events): every
// engine advertises its own ports in /server_info, duet's views of both
// prefill ranks go live, the prefill publishes the chat prompts' blocks
// with their token ids (none left out), and duet's CPU time reads.
func TestKVEventsStack(t *testing.T) {
	root := os.Getenv("DUET_TOKENIZERS_DIR")
	if root == "" {
		t.Skip("DUET_TOKENIZERS_DIR is not set: run through make (make test), which installs the tokenizer fixtures")
	}
	dir := filepath.Join(root, "qwen3")
	engine := []string{"--profile", "dense-8b-h100", "--time-scale", "10"}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{
		Prefill:       []SimSpec{{DPSize: 2, Args: engine}},
		Decode:        []SimSpec{{DPSize: 2, Args: engine}, {DPSize: 1, Args: engine}},
		PrefillPolicy: "least_cost", DecodePolicy: "least_cost",
		KVTimeout:    30 * time.Second,
		KVEvents:     true,
		SimTokenizer: dir,
		DuetYAML: fmt.Sprintf("tokenizer:\n  file: %s\n  config: %s\n  page_size: 16\nkv_events:\n  probe_interval: 100ms\n",
			filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json")),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.CloseLoggingIfFailed(t) })

	sims := append(append([]*Sim{}, s.Prefill...), s.Decode...)
	for _, sim := range sims {
		var info struct {
			KVEvents struct {
				Publisher string `json:"publisher"`
				Port      int    `json:"endpoint_port_base"`
				Replay    int    `json:"replay_endpoint_port_base"`
				DPSize    int    `json:"dp_size"`
			} `json:"kv_events"`
		}
		if err := GetJSON(ctx, sim.URL+"/server_info", &info); err != nil {
			t.Fatal(err)
		}
		if ev := info.KVEvents; ev.Publisher != "zmq" || ev.Port != sim.KVEventsPort || ev.Replay != sim.KVReplayPort || ev.DPSize != sim.DPSize || ev.Port == 0 {
			t.Fatalf("%s advertises %+v, started on %d and %d", sim.Name, ev, sim.KVEventsPort, sim.KVReplayPort)
		}
	}

	// Distinct tenants' prompts until both prefill ranks' views are live
	// and both ranks published their prompts' blocks (least_cost sends a
	// new prompt where the cache holds least). A rank goes live as soon as
	// duet replays its history from 0 on subscribing, before any traffic.
	// The decode engines cache nothing (no decode radix cache): after
	// their first batch they publish nothing.
	prefillTargets := map[string]bool{s.Prefill[0].URL + "#0": true, s.Prefill[0].URL + "#1": true}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		system := strings.Repeat(fmt.Sprintf("You are a careful assistant for tenant %d. ", i), 40)
		body := fmt.Sprintf(`{"model":"sim-model","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d?"}]}`, system, i)
		resp, out, err := s.Send(ctx, "POST", "/v1/chat/completions", nil, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, out)
		}
		fams, err := s.DuetMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		live := 0
		for _, m := range fams["duet_kv_events_state"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "target" && prefillTargets[l.GetValue()] && m.GetGauge().GetValue() == 2 {
					live++
				}
			}
		}
		var pub struct {
			Ranks []struct {
				Events uint64 `json:"events"`
			} `json:"ranks"`
		}
		if err := GetJSON(ctx, s.Prefill[0].URL+"/sim/kv_events", &pub); err != nil {
			t.Fatal(err)
		}
		published := 0
		for _, r := range pub.Ranks {
			if r.Events >= 2 { // AllBlocksCleared, then the prompts' blocks
				published++
			}
		}
		if live == 2 && published == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d requests, %d of the 2 prefill ranks live: %v", i+1, live, fams["duet_kv_events_state"])
		}
		time.Sleep(50 * time.Millisecond)
	}

	var pub struct {
		Ranks []struct {
			Events      uint64 `json:"events"`
			Unpublished uint64 `json:"unpublished_blocks"`
		} `json:"ranks"`
	}
	if err := GetJSON(ctx, s.Prefill[0].URL+"/sim/kv_events", &pub); err != nil {
		t.Fatal(err)
	}
	for _, r := range pub.Ranks {
		if r.Unpublished != 0 || r.Events < 2 { // AllBlocksCleared, then the prompts' blocks
			t.Fatalf("prefill ranks %+v: blocks left unpublished (prompts without token ids), or none published", pub.Ranks)
		}
	}
	if len(pub.Ranks) != 2 {
		t.Fatalf("prefill published %+v", pub.Ranks)
	}
	if cpu, err := s.Duet.CPUTime(); err != nil || cpu <= 0 {
		t.Fatalf("duet cpu time %s, %v", cpu, err)
	}
}
