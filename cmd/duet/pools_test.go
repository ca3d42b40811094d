package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/scheduler"
)

const twoPoolsYAML = `pools:
- name: ds
  models: [deepseek-ai/DeepSeek-V3]
  prefill: [{url: "http://10.0.0.1:30000"}]
  decode: [{url: "http://10.0.0.2:30000"}]
- name: qwen
  models: [Qwen/Qwen3-8B]
  decode: [{url: "http://10.0.1.1:8000", dp_size: 2}]
`

// Each pool has its own scheduler, registered under its pool label, and
// feedback and peers' picks reach the scheduler of their pool only.
func TestPoolSet(t *testing.T) {
	cfg := mustParse(t, twoPoolsYAML)
	reg := prometheus.NewRegistry()
	pools, err := newPools(cfg, scheduler.Config{}, zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	if got := pools.names(); fmt.Sprint(got) != "[ds qwen]" {
		t.Fatalf("pools %v", got)
	}
	if !pools[0].sched.PD() || pools[1].sched.PD() {
		t.Errorf("PD: %v %v, want true false", pools[0].sched.PD(), pools[1].sched.PD())
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labelled := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pool" {
					labelled[l.GetValue()] = true
				}
			}
		}
	}
	if !labelled["ds"] || !labelled["qwen"] {
		t.Errorf("metrics labelled with pools %v, want ds and qwen", labelled)
	}
	ep := pools.extproc()
	if len(ep) != 2 || ep[0].Models[0] != "deepseek-ai/DeepSeek-V3" || ep[1].PrefillCluster != "duet_qwen_prefill" {
		t.Errorf("extproc pools %+v", ep)
	}
	if cl := feedbackClusters(cfg); len(cl) != 2 || cl[1] != (accesslog.Clusters{Decode: "duet_qwen_decode", Prefill: "duet_qwen_prefill"}) {
		t.Errorf("feedback clusters %+v", cl)
	}
	// Without a pools section: one pool that serves every model.
	single, err := newPools(mustParse(t, `decode: [{url: "http://10.0.0.2:30000"}]`), scheduler.Config{}, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if ep := single.extproc(); len(ep) != 1 || ep[0].Name != "default" || ep[0].Models != nil {
		t.Errorf("implicit pool %+v", ep)
	}
	// A peer's pick reaches the scheduler of its pool only, and the
	// request's feedback, stamped with that pool, releases it there.
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"dp_size":2,"disaggregation_mode":"null"}`)
	}))
	defer engine.Close()
	cfg = mustParse(t, strings.Replace(twoPoolsYAML, "http://10.0.1.1:8000", engine.URL, 1))
	if pools, err = newPools(cfg, scheduler.Config{}, zap.NewNop(), prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	if err := pools[1].sched.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	hold := scheduler.PickedHold{Role: scheduler.RoleDecode, Target: scheduler.TargetKey{URL: engine.URL, Rank: 1}, Tokens: 100, Work: 100}
	replicaApplier{pools: pools}.ApplyPicked(scheduler.Picked{RequestID: "r1", Pool: "qwen", Holds: []scheduler.PickedHold{hold}})
	if ds, qw := pools[0].sched.Status().Reservations, pools[1].sched.Status().Reservations; ds != 0 || qw != 1 {
		t.Errorf("after qwen's pick: reservations ds %d, qwen %d; want 0, 1", ds, qw)
	}
	// Completions and picks of an unknown pool are dropped, not misapplied.
	pools.Complete(context.Background(), accesslog.Completion{RequestID: "r1", Pool: "nope", Leg: accesslog.LegRequest})
	pools.ApplyPicked(scheduler.Picked{RequestID: "r2", Pool: "nope", Holds: []scheduler.PickedHold{hold}})
	if qw := pools[1].sched.Status().Reservations; qw != 1 {
		t.Errorf("after an unknown pool's events: qwen reservations %d, want 1", qw)
	}
	pools.Complete(context.Background(), accesslog.Completion{RequestID: "r1", Pool: "qwen", Leg: accesslog.LegRequest})
	if qw := pools[1].sched.Status().Reservations; qw != 0 {
		t.Errorf("after qwen's feedback: qwen reservations %d, want 0", qw)
	}
}

// A reload applies each pool's lists to its own scheduler; a pool added
// needs a restart; switching a pool between PD and aggregated is refused.
func TestReloadPools(t *testing.T) {
	tests := []struct {
		name        string
		file        string
		want        string
		wantCalls   [2]int
		wantWarning string
	}{
		{"same file", twoPoolsYAML, reloadOK, [2]int{1, 1}, ""},
		{"an engine added to one pool", strings.Replace(twoPoolsYAML, `decode: [{url: "http://10.0.1.1:8000", dp_size: 2}]`,
			`decode: [{url: "http://10.0.1.1:8000", dp_size: 2}, {url: "http://10.0.1.2:8000"}]`, 1), reloadOK, [2]int{1, 1}, ""},
		{"a pool added", twoPoolsYAML + "- {name: c, models: [m], decode: [{url: \"http://10.0.2.1:1\"}]}\n", reloadOK, [2]int{1, 1}, "pools"},
		{"a pool's models changed", strings.Replace(twoPoolsYAML, "[Qwen/Qwen3-8B]", "[Qwen/Qwen3-32B]", 1), reloadOK, [2]int{1, 1}, "pools"},
		{"a pool turned PD", strings.Replace(twoPoolsYAML, `  decode: [{url: "http://10.0.1.1:8000", dp_size: 2}]`,
			"  prefill: [{url: \"http://10.0.1.9:8000\"}]\n  decode: [{url: \"http://10.0.1.1:8000\", dp_size: 2}]", 1), reloadInvalid, [2]int{0, 0}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			ds, qwen := &fakeSetter{pd: true}, &fakeSetter{}
			r := newReloader(writeConfig(t, tt.file), mustParse(t, twoPoolsYAML), map[string]endpointSetter{"ds": ds, "qwen": qwen}, zap.New(core), nil)
			if got := r.reload(context.Background()); got != tt.want {
				t.Fatalf("reload = %q, want %q", got, tt.want)
			}
			if got := [2]int{ds.calls, qwen.calls}; got != tt.wantCalls {
				t.Errorf("SetEndpoints calls %v, want %v", got, tt.wantCalls)
			}
			if tt.name == "an engine added to one pool" && len(qwen.decode) != 2 {
				t.Errorf("qwen's decode list %v, want 2 engines", qwen.decode)
			}
			warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
			got := ""
			if len(warns) == 1 {
				got = fmt.Sprint(warns[0].ContextMap()["fields"])
			}
			if !strings.Contains(got, tt.wantWarning) || (tt.wantWarning == "" && len(warns) > 0) {
				t.Errorf("warnings %v, want one naming %q", warns, tt.wantWarning)
			}
		})
	}
}

// TestPoolsFollowKVEvents: kv_events.mode decides which pools follow
// their engines' events: their scheduler reads the view, and the
// tracker's metrics are registered under the pool's label.
func TestPoolsFollowKVEvents(t *testing.T) {
	tests := []struct {
		mode string
		want []bool // per pool of twoPoolsYAML: ds, qwen
	}{
		{"auto", []bool{false, false}}, // no tokenizer in either pool
		{"on", []bool{true, true}},
		{"off", []bool{false, false}},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			cfg := mustParse(t, twoPoolsYAML+"kv_events: {mode: \""+tc.mode+"\", probe_interval: -1s}\n")
			reg := prometheus.NewRegistry()
			pools, err := newPools(cfg, scheduler.Config{}, zap.NewNop(), reg)
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range pools {
				if (p.events != nil) != tc.want[i] {
					t.Errorf("pool %s follows events: %v, want %v", p.cfg.Name, p.events != nil, tc.want[i])
				}
			}
			// The trackers' collectors answer (with no rank followed yet,
			// nothing), and registering them did not collide.
			if _, err := reg.Gather(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
