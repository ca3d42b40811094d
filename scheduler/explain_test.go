package scheduler

import (
	"errors"
	"math"
	"testing"
	"time"
)

// costSum adds up a price's parts.
func costSum(terms []CostTerm) float64 {
	var sum float64
	for _, t := range terms {
		sum += t.Value
	}
	return sum
}

// termsOf maps a price's parts by name.
func termsOf(terms []CostTerm) map[string]float64 {
	out := make(map[string]float64, len(terms))
	for _, t := range terms {
		out[t.Name] = t.Value
	}
	return out
}

// TestLeastCostExplainCost checks least_cost's explanation of a price: the
// parts of the chosen candidate's price on each role, and that the
// cheapest sum of parts is the candidate Pick chose.
func TestLeastCostExplainCost(t *testing.T) {
	engine := func(radix bool) *Endpoint {
		return &Endpoint{Role: RoleDecode, URL: "http://d", Ready: true, DecodeCache: DecodeCache{Radix: radix}}
	}
	e0, e1, radix := engine(false), engine(false), engine(true)
	tests := []struct {
		name  string
		role  Role
		req   Request
		cands []Candidate
		want  int
		terms map[string]float64
	}{
		{
			// The prompt is 8192 tokens, 6144 cached on rank 1 behind a
			// queue of 3072: own work 3 × 2048; the reuse rate learned
			// from this pick is 0.02 × 6144/8192, and with no known
			// capacity every uncached token evicts.
			name: "prefill, the cached rank", role: RolePrefill,
			req:   Request{PromptTokens: 8192},
			cands: costCands(costSpec{0, 0, 0}, costSpec{0, 6144, 3072}),
			want:  1,
			terms: map[string]float64{CostQueued: 3072, CostOwnWork: 6144, CostEviction: 2 * 0.015 * 2048},
		},
		{
			name: "prefill, the idle rank", role: RolePrefill,
			req:   Request{PromptTokens: 2048},
			cands: costCands(costSpec{0, 0, 4096}, costSpec{1, 0, 1024}),
			want:  1,
			terms: map[string]float64{CostQueued: 1024, CostOwnWork: 3 * 2048, CostEviction: 0},
		},
		{
			// need = 1000 + 2 × 500; rank 1 after the request holds 2500,
			// its engine's heaviest rank (0) 4000; capacity 2000 overflows
			// by 500.
			name: "decode, the lighter rank of a lockstep engine", role: RoleDecode,
			req: Request{PromptTokens: 1000, MaxTokens: 500, Items: 2},
			cands: []Candidate{
				{Target: Target{Endpoint: e0, Rank: 0}, Load: Load{Tokens: 4000, Capacity: 2000}},
				{Target: Target{Endpoint: e0, Rank: 1}, Load: Load{Tokens: 500, Capacity: 2000}},
				{Target: Target{Endpoint: e1, Rank: 0}, Load: Load{Tokens: 5000}},
			},
			want:  1,
			terms: map[string]float64{CostPace: 4000, CostBalance: 2500, CostOverflow: 4 * 500, CostDecodeCache: 0},
		},
		{
			name: "decode, the rank whose radix cache holds the conversation", role: RoleDecode,
			req: Request{PromptTokens: 1000, MaxTokens: 100},
			cands: []Candidate{
				{Target: Target{Endpoint: e1, Rank: 0}, Load: Load{Tokens: 0}},
				{Target: Target{Endpoint: radix, Rank: 0}, Load: Load{Tokens: 2000}, CachedTokens: 900},
			},
			want:  1,
			terms: map[string]float64{CostPace: 3100, CostBalance: 3100, CostOverflow: 0, CostDecodeCache: -8 * 900},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, PolicySpec{Name: "least_cost", Role: tt.role})
			req := tt.req
			req.Now = time.Unix(100, 0)
			got := mustPick(t, p, &req, tt.cands)
			if got != tt.want {
				t.Fatalf("Pick = %d, want %d", got, tt.want)
			}
			ex := p.(CostExplainer)
			lc := p.(*leastCost)
			reuse := lc.reuse
			terms := ex.ExplainCost(&req, tt.cands, got)
			if lc.reuse != reuse {
				t.Errorf("ExplainCost changed the learned reuse rate: %v, was %v", lc.reuse, reuse)
			}
			if len(terms) != len(tt.terms) {
				t.Errorf("terms = %v, want %d of them", terms, len(tt.terms))
			}
			for name, v := range termsOf(terms) {
				want, ok := tt.terms[name]
				if !ok || math.Abs(v-want) > 1e-9 {
					t.Errorf("%s = %v, want %v (terms %v)", name, v, want, terms)
				}
			}
			cheapest := -1
			for i := range tt.cands {
				if c := costSum(ex.ExplainCost(&req, tt.cands, i)); cheapest < 0 || c < costSum(ex.ExplainCost(&req, tt.cands, cheapest)) {
					cheapest = i
				}
			}
			if cheapest != got {
				t.Errorf("the cheapest explained price is candidate %d's, Pick chose %d", cheapest, got)
			}
			if terms := ex.ExplainCost(&req, tt.cands, len(tt.cands)); terms != nil {
				t.Errorf("ExplainCost out of range = %v, want nil", terms)
			}
		})
	}
}

// TestPickExplains checks Request.Explain: Pick fills it with the decision,
// the chosen targets, their numbers and, for least_cost, the price's
// parts; a failed pick with its error; and a pick that does not ask is
// explained nowhere.
func TestPickExplains(t *testing.T) {
	tests := []struct {
		name     string
		pd       bool
		policy   string
		noDecode bool // the decode pool has no ready endpoint
		want     func(t *testing.T, d Decision, ex DecisionStatus)
	}{
		{
			name: "pd least_cost", pd: true, policy: "least_cost",
			want: func(t *testing.T, d Decision, ex DecisionStatus) {
				if ex.Prefill == nil || ex.Decode == nil || ex.Err != "" {
					t.Fatalf("explained %+v", ex)
				}
				for _, c := range []struct {
					role   string
					choice *ChoiceStatus
					target Target
					terms  []string
				}{
					{"prefill", ex.Prefill, *d.Prefill, []string{CostQueued, CostOwnWork, CostEviction}},
					{"decode", ex.Decode, d.Decode, []string{CostPace, CostBalance, CostOverflow, CostDecodeCache}},
				} {
					if c.choice.Target != c.target.String() || c.choice.Rank != c.target.Rank || c.choice.Policy != "least_cost" ||
						c.choice.Candidates != 4 || c.choice.Tokens <= 0 {
						t.Errorf("%s: %+v, chosen %s", c.role, c.choice, c.target)
					}
					got := termsOf(c.choice.Cost)
					for _, name := range c.terms {
						if _, ok := got[name]; !ok {
							t.Errorf("%s: no %s in the cost %v", c.role, name, c.choice.Cost)
						}
					}
				}
				if ex.Prefill.Cost[1].Value <= 0 {
					t.Errorf("prefill own work = %v, want the prompt's", ex.Prefill.Cost[1])
				}
			},
		},
		{
			name: "aggregated round_robin: no price to explain", policy: "round_robin",
			want: func(t *testing.T, d Decision, ex DecisionStatus) {
				if ex.Prefill != nil || ex.Decode == nil || ex.Decode.Policy != "round_robin" || ex.Decode.Cost != nil {
					t.Errorf("explained %+v (decode %+v)", ex, ex.Decode)
				}
				if ex.Decode.Target != d.Decode.String() || ex.Decode.Candidates != 4 {
					t.Errorf("decode = %+v, chosen %s", ex.Decode, d.Decode)
				}
			},
		},
		{
			name: "no decode endpoint", policy: "least_cost", noDecode: true,
			want: func(t *testing.T, _ Decision, ex DecisionStatus) {
				if ex.Err == "" || ex.Decode != nil || ex.RequestID != "r1" || ex.Model != "m" {
					t.Errorf("explained %+v, want the failure", ex)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{DecodePolicy: PolicySpec{Name: tt.policy}, PrefillPolicy: PolicySpec{Name: tt.policy}}
			if tt.noDecode {
				cfg.Decode = []EndpointSpec{{URL: newFakeEngine(t, nil).url()}}
			} else {
				cfg.Decode = enginePool(t, 2, 2, "decode")
			}
			if tt.pd {
				cfg.Prefill = enginePool(t, 2, 2, "prefill")
			}
			s := newTestScheduler(t, cfg, nil)
			_ = s.Discover(testContext(t))
			req := &Request{ID: "r1", Path: "/generate", Model: "m", Prompt: []byte("hello there, a prompt"), MaxTokens: 16,
				Explain: &DecisionStatus{}}
			d, err := s.Pick(testContext(t), req)
			if (err != nil) != tt.noDecode || (err != nil && !errors.Is(err, ErrNoEndpoints)) {
				t.Fatalf("Pick: %v", err)
			}
			tt.want(t, d, *req.Explain)
			// Not asked, not explained: the status ring still records it.
			plain := &Request{ID: "r2", Path: "/generate", Prompt: []byte("hello")}
			_, _ = s.Pick(testContext(t), plain)
			if plain.Explain != nil {
				t.Error("Pick explained a request that did not ask")
			}
			if st := s.Status(); len(st.Decisions) != 2 || st.Decisions[1].Decode != nil && st.Decisions[1].Decode.Cost != nil {
				t.Errorf("Status decisions = %+v, want 2 without costs", st.Decisions)
			}
		})
	}
}
