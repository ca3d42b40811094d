package scheduler

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/scheduler/kvevents"
)

// fakeView is a CacheView with set answers per target.
type fakeView struct {
	mu      sync.Mutex
	targets []kvevents.Target[TargetKey]
	matches map[TargetKey]kvevents.Match // absent: no word
	routed  []TargetKey
}

func (v *fakeView) SetTargets(t []kvevents.Target[TargetKey]) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.targets = slices.Clone(t)
}

func (v *fakeView) Match(key TargetKey, _ []uint64) (kvevents.Match, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m, ok := v.matches[key]
	return m, ok
}

func (v *fakeView) Routed(key TargetKey, _ []uint64, _ time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.routed = append(v.routed, key)
}

// TestParseKVEvents reads SGLang's kv_events descriptor.
func TestParseKVEvents(t *testing.T) {
	tests := []struct {
		name, json string
		want       KVEvents
	}{
		{"absent", `{}`, KVEvents{}},
		{"null", `{"kv_events":null}`, KVEvents{}},
		{"null publisher", `{"kv_events":{"publisher":"null","endpoint_port_base":5557}}`, KVEvents{}},
		{"bad port", `{"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":70000}}`, KVEvents{}},
		{"SGLang's default", `{"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,"topic":"","block_size":16,"dp_size":2}}`,
			KVEvents{Host: "*", Port: 5557, BlockSize: 16}},
		{"with replay and topic", `{"kv_events":{"publisher":"zmq","endpoint_host":"10.0.0.7","endpoint_port_base":6000,"replay_endpoint_port_base":6100,"topic":"kv","block_size":1}}`,
			KVEvents{Host: "10.0.0.7", Port: 6000, ReplayPort: 6100, Topic: "kv", BlockSize: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseKVEvents(gjson.Get(tc.json, "kv_events")); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestCacheViewTargets: discovery names every rank of every engine that
// advertises events, on its own address where the engine binds a
// wildcard; an engine that advertises none uses its configured ports.
func TestCacheViewTargets(t *testing.T) {
	advertised := newFakeEngine(t, serverInfo200(strings.TrimSuffix(info(2, "", -1), "}")+
		`,"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,"replay_endpoint_port_base":5600,"topic":"","block_size":16,"dp_size":2}}`))
	configured := newFakeEngine(t, serverInfo200(info(1, "", -1)))
	silent := newFakeEngine(t, serverInfo200(info(1, "", -1)))
	view := &fakeView{}
	s := newTestScheduler(t, Config{Decode: []EndpointSpec{
		{URL: advertised.url()},
		{URL: configured.url(), KVEvents: KVEvents{Port: 7000}},
		{URL: silent.url()},
	}, CacheView: view}, nil)
	mustDiscover(t, s)
	host := strings.Split(advertised.addr(), ":")[0]
	want := []kvevents.Target[TargetKey]{
		{Key: TargetKey{advertised.url(), 0}, Name: advertised.url() + "#0", Source: kvevents.Source{Endpoint: "tcp://" + host + ":5557", Replay: "tcp://" + host + ":5600"}},
		{Key: TargetKey{advertised.url(), 1}, Name: advertised.url() + "#1", Source: kvevents.Source{Endpoint: "tcp://" + host + ":5558", Replay: "tcp://" + host + ":5601"}},
		{Key: TargetKey{configured.url(), 0}, Name: configured.url() + "#0", Source: kvevents.Source{Endpoint: "tcp://" + host + ":7000"}},
	}
	view.mu.Lock()
	defer view.mu.Unlock()
	if !slices.Equal(view.targets, want) {
		t.Errorf("targets\n%+v\nwant\n%+v", view.targets, want)
	}
}

// TestPickReadsCacheView: with token ids, the view's word replaces the
// prefix index's estimate where it has one (least_cost follows the rank
// the engine says holds the prompt, not the one duet routed it to), the
// estimate stays where it has none, a warming view counts the larger of
// the two, and the chosen target hears that the blocks were routed.
func TestPickReadsCacheView(t *testing.T) {
	e := newFakeEngine(t, serverInfo200(info(3, "prefill", 8998)))
	dec := newFakeEngine(t, serverInfo200(info(1, "decode", -1)))
	prompt := make([]int64, 64*16)
	for i := range prompt {
		prompt[i] = int64(i%1000 + 1)
	}
	rank := func(r int) TargetKey { return TargetKey{URL: e.url(), Rank: r} }
	tests := []struct {
		name    string
		matches map[TargetKey]kvevents.Match
		want    int
	}{
		{"no word: the index's rank", nil, 0},
		{"the engine says rank 2 holds it, rank 0 evicted it", map[TargetKey]kvevents.Match{
			rank(0): {}, rank(1): {}, rank(2): {GPU: 64, Any: 64, Blocks: 64}}, 2},
		{"host tier only on rank 1, nothing on the GPU of rank 0", map[TargetKey]kvevents.Match{
			rank(0): {}, rank(1): {GPU: 0, Any: 64, Blocks: 64}, rank(2): {}}, 1},
		{"rank 0 warming with an empty view: the estimate counts", map[TargetKey]kvevents.Match{
			rank(0): {Partial: true}, rank(1): {GPU: 16, Any: 16, Blocks: 16}, rank(2): {}}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			view := &fakeView{}
			s := newTestScheduler(t, Config{Prefill: []EndpointSpec{{URL: e.url()}}, Decode: []EndpointSpec{{URL: dec.url()}},
				PrefillPolicy: PolicySpec{Name: "least_cost"}, Load: LoadConfig{Interval: -1}, CacheView: view}, nil)
			mustDiscover(t, s)
			// The first request goes to rank 0 (all idle, earliest), which
			// the index then believes holds the prompt.
			d, err := s.Pick(testContext(t), &Request{ID: "first", TokenIDs: prompt})
			if err != nil || d.Prefill.Rank != 0 {
				t.Fatalf("first pick: %v, %v", d.Prefill, err)
			}
			s.Complete(Feedback{RequestID: "first"})
			view.mu.Lock()
			view.matches, view.routed = tc.matches, nil
			view.mu.Unlock()
			d, err = s.Pick(testContext(t), &Request{ID: "second", TokenIDs: append(slices.Clone(prompt), 7, 8, 9)})
			if err != nil {
				t.Fatal(err)
			}
			if d.Prefill.Rank != tc.want {
				t.Errorf("picked rank %d, want %d", d.Prefill.Rank, tc.want)
			}
			view.mu.Lock()
			defer view.mu.Unlock()
			if !slices.Equal(view.routed, []TargetKey{rank(d.Prefill.Rank)}) {
				t.Errorf("routed %v, want the chosen rank", view.routed)
			}
		})
	}
}
