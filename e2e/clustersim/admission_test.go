package clustersim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// defaultPolicy is duet's shipped routing.
var defaultPolicy = bench.Policy{Name: "default", Prefill: scheduler.DefaultPrefillPolicy, Decode: scheduler.DefaultDecodePolicy}

// overloaded is a cluster of one prefill and one decode engine of dp 4
// under the variable workload at 10 requests/s: about twice what it
// serves within a 2 s TTFT.
func overloaded(t *testing.T) Config {
	t.Helper()
	w := testWorkload(t, bench.WorkloadVariable, 10, 30*time.Second, 5)
	return Config{Cluster: Uniform("dsv3-dp8-h100-node", 1, 1, 4), Policy: defaultPolicy, Workload: w, Warmup: 5 * time.Second, Seed: 2}
}

// digest is the SHA-256 of v's JSON.
func digest(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestNoAdmissionUnchanged pins the results of runs without admission to
// those of the simulator before admission existed, byte for byte (the
// JSON of every request and of the summary), with one replica and with
// three, sharing or not. A deliberate change to the scheduler or the
// engine model that moves them must update the digests; admission must
// not.
func TestNoAdmissionUnchanged(t *testing.T) {
	for _, tt := range []struct {
		name            string
		replicas        int
		share           bool
		result, summary string
	}{
		{"one replica", 1, false, "6eb3b74e649f19d3871f559d7dba888b46668aaa4c71dca9fd086bb9625e2f8a", "f0bce41329ccb7a2757717590496c349cc33b68f7be7c4c24db6220a73bb4b6b"},
		{"three sharing", 3, true, "73dc39bd60a63eedd76af95b480946da87df1d9b98ab930663edb37187c337c3", "0b4f302579d4167e796a7b79a7d8c104f39dfeffa6bbc53af399c0a30e88f56f"},
		{"three apart", 3, false, "5c61c652b2bd06e03149624ce0799a6142d2ca9dc43408f2b99ed3b5ee343924", "a909ffa6a881432697589d9dd28b67c9ad7acf6d32839c6a066e4430e700430c"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := overloaded(t)
			cfg.Replicas, cfg.Share = tt.replicas, tt.share
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := digest(t, res); got != tt.result {
				t.Errorf("result digest %s, want %s", got, tt.result)
			}
			if got := digest(t, res.Summarize()); got != tt.summary {
				t.Errorf("summary digest %s, want %s", got, tt.summary)
			}
		})
	}
}

// TestAdmissionNeverSaturatedChangesNothing: with every saturation
// measure off the pool is never saturated, so every request is picked on
// arrival, as without admission, and every request sees what it saw
// without it.
func TestAdmissionNeverSaturatedChangesNothing(t *testing.T) {
	cfg := overloaded(t)
	off, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Admission = testAdmission(scheduler.SaturationConfig{PrefillTokens: -1, KVFraction: -1, Waiting: -1}, 2*time.Second, 128)
	on, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range on.Requests {
		q := &on.Requests[i]
		if q.Queued || q.Refused != "" || q.Class != "batch" {
			t.Fatalf("request %d: %+v; want it picked at once, of the default class", i, *q)
		}
		q.Class, q.Tenant = "", ""
	}
	if !reflect.DeepEqual(off, on) {
		t.Fatal("admission that never queues changed the results")
	}
}

// testAdmission is an interactive class above a batch one (the default,
// whose wait limit is wait; the interactive class waits up to five times
// as long), at most maxQueued requests queued.
func testAdmission(sat scheduler.SaturationConfig, wait time.Duration, maxQueued int) *Admission {
	return &Admission{
		Queue: admit.Config{Classes: []admit.Class{
			{Name: "interactive", Priority: 1, WaitLimit: 5 * wait},
			{Name: "batch", WaitLimit: wait},
		}, MaxRequests: maxQueued, MaxTokens: 4 << 20},
		DefaultClass: "batch",
		Saturation:   sat,
	}
}

// withClasses makes every fifth session interactive and the rest batch,
// and spreads them over tenants a to d.
func withClasses(p *Prepared) *Prepared {
	out := *p
	out.Workload.Sessions = slices.Clone(p.Workload.Sessions)
	for i := range out.Workload.Sessions {
		s := &out.Workload.Sessions[i]
		s.Class, s.Tenant = "batch", string(rune('a'+i%4))
		if i%5 == 0 {
			s.Class = "interactive"
		}
	}
	return &out
}

// TestAdmissionUnderOverload runs the overloaded cluster with two classes
// and admission on: every request is served or refused with a reason
// (none lost, none left unfinished), nothing of the high class is shed
// for the low one, the queues end empty, and the high class's p99 TTFT is
// below what it is without admission.
func TestAdmissionUnderOverload(t *testing.T) {
	tight := scheduler.SaturationConfig{PrefillTokens: 4096, KVFraction: 0.8}
	for _, tt := range []struct {
		name      string
		sat       scheduler.SaturationConfig
		maxQueued int
		replicas  int
		reasons   []string // at least one refusal of each
	}{
		{"wait limits", tight, 128, 1, []string{"wait_limit"}},
		{"small queue", tight, 6, 1, []string{"queue_full", "shed"}},
		{"three replicas", tight, 128, 3, []string{"wait_limit"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := overloaded(t)
			cfg.Workload = withClasses(cfg.Workload)
			cfg.Replicas, cfg.Share = tt.replicas, tt.replicas > 1
			base, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Admission = testAdmission(tt.sat, 2*time.Second, tt.maxQueued)
			r, err := newRun(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.loop(context.Background()); err != nil {
				t.Fatal(err)
			}
			for i, q := range r.adm.queues {
				if q.Len() != 0 {
					t.Errorf("replica %d: %d requests still queued", i, q.Len())
				}
			}
			if len(r.adm.entries) != 0 || r.active != 0 {
				t.Errorf("%d queued entries, %d requests active at the end", len(r.adm.entries), r.active)
			}
			res := r.result()
			counts := map[string]int{}
			for _, q := range res.Requests {
				switch {
				case q.Err == "":
				case q.Refused != "" && q.Err == refusedPrefix+q.Refused:
					counts[q.Refused]++
					if q.Refused == "shed" && q.Class == "interactive" {
						t.Errorf("interactive request shed: %+v", q)
					}
				default:
					t.Errorf("request neither served nor refused with a reason: %+v", q)
				}
			}
			for _, want := range tt.reasons {
				if counts[want] == 0 {
					t.Errorf("refusals %v: want some %s", counts, want)
				}
			}
			slo := SLO{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond}
			high := func(res *Result) Group { return classGroup(t, res.Breakdown(slo), "interactive") }
			on, off := high(res), high(base)
			t.Logf("interactive p99 TTFT %.0f ms with admission (served %.0f), %.0f without; refusals %v", on.TTFTP99, on.ServedTTFTP99, off.TTFTP99, counts)
			if !(on.TTFTP99 < off.TTFTP99) || math.IsInf(on.TTFTP99, 0) {
				t.Errorf("interactive p99 TTFT %.0f ms with admission, %.0f without: want lower", on.TTFTP99, off.TTFTP99)
			}
		})
	}
}

// classGroup returns the breakdown's class called name.
func classGroup(t *testing.T, b Breakdown, name string) Group {
	t.Helper()
	for _, g := range b.Classes {
		if g.Name == name {
			return g
		}
	}
	t.Fatalf("no class %s in %+v", name, b.Classes)
	return Group{}
}

// TestAdmissionIsDeterministic runs one overloaded configuration twice
// and demands identical results.
func TestAdmissionIsDeterministic(t *testing.T) {
	cfg := overloaded(t)
	cfg.Workload = withClasses(cfg.Workload)
	cfg.Replicas, cfg.Share = 2, true
	cfg.Admission = testAdmission(scheduler.SaturationConfig{PrefillTokens: 4096}, 2*time.Second, 16)
	a, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two runs of one configuration differ")
	}
}

// TestAdmissionRefusesOracleAndBypass: admission needs duet's scheduler
// on every request.
func TestAdmissionRefusesOracleAndBypass(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  func(*Config)
	}{
		{"oracle", func(c *Config) { c.Oracle = OracleLoad }},
		{"bypass", func(c *Config) { c.Bypass = 0.5 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := overloaded(t)
			cfg.Admission = testAdmission(scheduler.SaturationConfig{}, time.Second, 8)
			tt.set(&cfg)
			if _, err := Run(context.Background(), cfg); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

// TestSLO checks which requests meet an SLO.
func TestSLO(t *testing.T) {
	perToken := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	slo := SLO{TTFT: 2 * time.Second, Allowance: perToken, TPOT: 50 * time.Millisecond}
	for _, tt := range []struct {
		name  string
		q     Request
		first bool
		met   bool
	}{
		{"in time", Request{TTFT: time.Second, TPOT: 40 * time.Millisecond, OutputTokens: 10}, true, true},
		{"late", Request{TTFT: 3 * time.Second, OutputTokens: 10}, false, false},
		{"late but long prompt", Request{TTFT: 3 * time.Second, PromptTokens: 2000, OutputTokens: 1}, true, true},
		{"slow decode", Request{TTFT: time.Second, TPOT: 60 * time.Millisecond, OutputTokens: 10}, true, false},
		{"refused", Request{Err: "refused: wait_limit", Refused: "wait_limit"}, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := slo.FirstTokenMet(tt.q); got != tt.first {
				t.Errorf("FirstTokenMet = %v, want %v", got, tt.first)
			}
			if got := slo.Met(tt.q); got != tt.met {
				t.Errorf("Met = %v, want %v", got, tt.met)
			}
		})
	}
}
