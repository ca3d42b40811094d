package scheduler

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
)

// loadsBody is a /v1/loads answer for one rank.
func loadsBody(total, capacity int64, waiting int) string {
	return fmt.Sprintf(`{"loads":[{"dp_rank":0,"num_used_tokens":0,"num_total_tokens":%d,"max_total_num_tokens":%d,"num_waiting_reqs":%d}]}`, total, capacity, waiting)
}

// A pool is saturated while every target of one role is: a prefill rank
// by the prompt work reserved or reported, a decode rank by its KV share,
// either by the engine's waiting queue. Feedback and scrapes tell
// OnRelease.
func TestSaturation(t *testing.T) {
	tests := []struct {
		name string
		// prefillLoads and decodeLoads are the engines' /v1/loads.
		prefillLoads, decodeLoads string
		// prompts are the picks made first (bytes of prompt each).
		prompts []int
		want    []RoleSaturation
	}{
		{"idle", loadsBody(0, 10000, 0), loadsBody(0, 10000, 0), nil,
			[]RoleSaturation{{RolePrefill, 1, 0}, {RoleDecode, 1, 0}}},
		{"prefill work reserved", loadsBody(0, 10000, 0), loadsBody(0, 100000, 0), []int{4000},
			[]RoleSaturation{{RolePrefill, 1, 1}, {RoleDecode, 1, 0}}},
		{"prefill queue reported", loadsBody(900, 10000, 0), loadsBody(0, 10000, 0), nil,
			[]RoleSaturation{{RolePrefill, 1, 1}, {RoleDecode, 1, 0}}},
		{"decode KV full", loadsBody(0, 10000, 0), loadsBody(9500, 10000, 0), nil,
			[]RoleSaturation{{RolePrefill, 1, 0}, {RoleDecode, 1, 1}}},
		{"decode queue", loadsBody(0, 10000, 0), loadsBody(10, 10000, 3), nil,
			[]RoleSaturation{{RolePrefill, 1, 0}, {RoleDecode, 1, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newFakeEngine(t, map[string]response{"/server_info": ok(info(1, "prefill", 8998)), "/v1/loads": ok(tt.prefillLoads)})
			d := newFakeEngine(t, map[string]response{"/server_info": ok(info(1, "decode", -1)), "/v1/loads": ok(tt.decodeLoads)})
			var released atomic.Int32
			s := newTestScheduler(t, Config{
				Prefill: []EndpointSpec{{URL: p.url()}}, Decode: []EndpointSpec{{URL: d.url()}},
				Saturation: SaturationConfig{PrefillTokens: 500, KVFraction: 0.9, Waiting: 3},
				OnRelease:  func() { released.Add(1) },
			}, nil)
			mustDiscover(t, s)
			s.ScrapeLoads(testContext(t))
			for i, n := range tt.prompts {
				req := &Request{ID: fmt.Sprint("r", i), Prompt: []byte(strings.Repeat("x", n))}
				if _, err := s.Pick(testContext(t), req); err != nil {
					t.Fatal(err)
				}
			}
			got := s.Saturation()
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("saturation %v, want %v", got, tt.want)
			}
			full := false
			for _, r := range tt.want {
				full = full || r.Full()
			}
			if s.Saturated() != full {
				t.Errorf("Saturated() = %v, want %v", !full, full)
			}
			before := released.Load()
			for i := range tt.prompts {
				s.Complete(Feedback{RequestID: fmt.Sprint("r", i)})
			}
			if len(tt.prompts) > 0 {
				if released.Load() == before {
					t.Error("feedback did not tell OnRelease")
				}
				if r := s.Saturation(); r[0].Saturated != 0 {
					t.Errorf("prefill still saturated after feedback: %v", r)
				}
			}
		})
	}
}

// Negative thresholds turn each measure off.
func TestSaturationOff(t *testing.T) {
	p := newFakeEngine(t, map[string]response{"/server_info": ok(info(1, "prefill", 8998)), "/v1/loads": ok(loadsBody(90000, 10000, 50))})
	d := newFakeEngine(t, map[string]response{"/server_info": ok(info(1, "decode", -1)), "/v1/loads": ok(loadsBody(9999, 10000, 50))})
	s := newTestScheduler(t, Config{
		Prefill: []EndpointSpec{{URL: p.url()}}, Decode: []EndpointSpec{{URL: d.url()}},
		Saturation: SaturationConfig{PrefillTokens: -1, KVFraction: -1, Waiting: -1},
	}, nil)
	mustDiscover(t, s)
	s.ScrapeLoads(testContext(t))
	if s.Saturated() {
		t.Errorf("saturated with every measure off: %v", s.Saturation())
	}
}

// Only a pool whose every engine schedules by priority, in one order,
// gets the priority field.
func TestEnginePriority(t *testing.T) {
	tests := []struct {
		name         string
		prefill, dec string
		want         PriorityScheduling
		wantOK       bool
	}{
		{"none", "", "", PriorityScheduling{}, false},
		{"both", `,"enable_priority_scheduling":true`, `,"enable_priority_scheduling":true`, PriorityScheduling{Enabled: true}, true},
		{"one", `,"enable_priority_scheduling":true`, "", PriorityScheduling{}, false},
		{"orders differ", `,"enable_priority_scheduling":true,"schedule_low_priority_values_first":true`, `,"enable_priority_scheduling":true`, PriorityScheduling{}, false},
		{"low first", `,"enable_priority_scheduling":true,"schedule_low_priority_values_first":true`, `,"enable_priority_scheduling":true,"schedule_low_priority_values_first":true`,
			PriorityScheduling{Enabled: true, LowValuesFirst: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pi := strings.Replace(info(1, "prefill", 8998), `,"internal_states"`, tt.prefill+`,"internal_states"`, 1)
			di := strings.Replace(info(1, "decode", -1), `,"internal_states"`, tt.dec+`,"internal_states"`, 1)
			p := newFakeEngine(t, serverInfo200(pi))
			d := newFakeEngine(t, serverInfo200(di))
			s := newTestScheduler(t, Config{Prefill: []EndpointSpec{{URL: p.url()}}, Decode: []EndpointSpec{{URL: d.url()}}}, nil)
			mustDiscover(t, s)
			got, ok := s.EnginePriority()
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("got %+v %v, want %+v %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// A share scales every threshold: half the prompt work saturates at 0.5.
func TestSaturatedAt(t *testing.T) {
	p := newFakeEngine(t, map[string]response{"/server_info": ok(info(1, "prefill", 8998)), "/v1/loads": ok(loadsBody(0, 10000, 0))})
	d := newFakeEngine(t, map[string]response{"/server_info": ok(info(1, "decode", -1)), "/v1/loads": ok(loadsBody(0, 100000, 0))})
	s := newTestScheduler(t, Config{
		Prefill: []EndpointSpec{{URL: p.url()}}, Decode: []EndpointSpec{{URL: d.url()}},
		Saturation: SaturationConfig{PrefillTokens: 1500},
	}, nil)
	mustDiscover(t, s)
	s.ScrapeLoads(testContext(t))
	if _, err := s.Pick(testContext(t), &Request{ID: "r", Prompt: []byte(strings.Repeat("x", 4000))}); err != nil {
		t.Fatal(err)
	}
	if s.Saturated() || s.SaturatedAt(1) {
		t.Errorf("saturated at the full threshold: %v", s.Saturation())
	}
	if !s.SaturatedAt(0.5) {
		t.Error("not saturated at half the threshold")
	}
}

// BenchmarkSaturated is the gate every admitted request passes while its
// pool has room: 2 engines × dp 8 (16 targets), aggregated.
func BenchmarkSaturated(b *testing.B) {
	s := benchScheduler(b, 2, 8, "least_cost")
	b.ReportAllocs()
	for b.Loop() {
		if s.Saturated() {
			b.Fatal("saturated")
		}
	}
}
