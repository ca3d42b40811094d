package clustersim

import (
	"context"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/kvevents"
)

// TestEventsMirrorTheEngines: with KV events delivered at once, every
// replica's view of every prefill rank holds exactly the blocks the engine
// model's cache holds when the run ends, whatever was evicted or emptied
// on the way (a restart mid-run, seen as AllBlocksCleared); with a delay,
// the views lag but every prefill rank is live. Decode engines without a
// decode radix cache publish nothing. Each mode serves every measured
// request.
func TestEventsMirrorTheEngines(t *testing.T) {
	w, err := bench.Generate(bench.WorkloadCachePressure, 1.5, 90*time.Second, 5, bench.Params{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Prepare(w, "sim-model", 16)
	if err != nil {
		t.Fatal(err)
	}
	cluster := Uniform("dsv3-dp8-h100-node", 2, 2, 2)
	decodeCache := Uniform("dsv3-dp8-h100-node", 2, 2, 2)
	for i := range decodeCache.Decode {
		decodeCache.Decode[i].DecodeRadixCache = true
	}
	for _, tc := range []struct {
		name        string
		cache       CacheMode
		delay       time.Duration
		replicas    int
		decodeCache bool
	}{
		{"events at once", CacheEvents, 0, 1, false},
		{"events at once, two replicas", CacheEvents, 0, 2, false},
		{"events after 200ms", CacheEvents, 200 * time.Millisecond, 1, false},
		{"events at once, decode radix caches", CacheEvents, 0, 1, true},
		{"tokens", CacheTokens, 0, 1, false},
		{"oracle", CacheOracle, 0, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cluster
			if tc.decodeCache {
				c = decodeCache
			}
			r, err := newRun(Config{Cluster: c, Policy: policy(t, "least_cost"), Workload: p, Warmup: 10 * time.Second,
				Seed: 2, Cache: tc.cache, EventDelay: tc.delay, Replicas: tc.replicas,
				Restarts: []Restart{{At: 45 * time.Second, Role: scheduler.RolePrefill, Engine: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.loop(context.Background()); err != nil {
				t.Fatal(err)
			}
			if s := r.result().Summarize(); s.Requests == 0 || s.Served != s.Requests {
				t.Fatalf("summary %+v: want every measured request served", s)
			}
			if tc.cache != CacheEvents {
				return
			}
			if len(r.views) != tc.replicas {
				t.Fatalf("%d views, want one per replica", len(r.views))
			}
			for _, v := range r.views {
				for _, st := range v.Status() {
					e := r.engineAt(st.Key.URL)
					if e.role == scheduler.RoleDecode && !tc.decodeCache {
						// Without a decode radix cache a decode engine
						// caches nothing and publishes nothing: its ranks
						// stay on the estimate.
						if st.State != kvevents.StateFallback || st.Blocks != 0 {
							t.Errorf("%s: %s with %d blocks, want no events", st.Name, st.State, st.Blocks)
						}
						continue
					}
					if e.role == scheduler.RolePrefill && e.index == 1 && st.View.Cleared < 2 {
						t.Errorf("%s: cleared %d times, want the restart seen", st.Name, st.View.Cleared)
					}
					if st.State != kvevents.StateLive {
						t.Errorf("%s: %s, want live", st.Name, st.State)
					}
					if tc.delay > 0 {
						continue
					}
					if want := e.model.CacheBlocks(st.Key.Rank); st.Blocks != want {
						t.Errorf("%s: the view holds %d blocks, the engine %d", st.Name, st.Blocks, want)
					}
					if st.View.Orphans != 0 || st.View.Malformed != 0 {
						t.Errorf("%s: counts %+v", st.Name, st.View)
					}
				}
			}
		})
	}
}
