package scheduler

import (
	"errors"
	"strings"
	"testing"
)

func TestNewPolicy(t *testing.T) {
	tests := []struct {
		name    string
		wantErr bool
	}{
		{"round_robin", false},
		{"least_tokens", false},
		{"random", false},
		{"power_of_two", false},
		{"prefix_hash", false},
		{"cache_aware", false},
		{"weighted", false},
		{"", true},
		{"Round_Robin", true},
		{"least-tokens", true},
		{"prefix", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPolicy(PolicySpec{Name: tt.name})
			if tt.wantErr {
				if err == nil {
					t.Fatalf("NewPolicy(%q) = %v, want an error", tt.name, p.Name())
				}
				if !strings.Contains(err.Error(), "round_robin") || !strings.Contains(err.Error(), "unknown policy") {
					t.Errorf("NewPolicy(%q) error %q should name the valid policies", tt.name, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewPolicy(%q): %v", tt.name, err)
			}
			if p.Name() != tt.name {
				t.Errorf("Name() = %q, want %q", p.Name(), tt.name)
			}
		})
	}
}

func TestRoundRobin(t *testing.T) {
	eps := []Endpoint{
		{Address: "a:1", DPSize: 2},
		{Address: "b:1", DPSize: 3},
	}
	var all []Candidate
	for i := range eps {
		for r := range eps[i].DPSize {
			all = append(all, Candidate{Target: Target{Endpoint: &eps[i], Rank: r}})
		}
	}
	tests := []struct {
		name  string
		cands []Candidate
		picks int
	}{
		{"one target", all[:1], 7},
		{"two targets", all[:2], 10},
		{"five targets", all, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPolicy(PolicySpec{Name: "round_robin"})
			if err != nil {
				t.Fatal(err)
			}
			counts := map[string]int{}
			for i := range tt.picks {
				got, err := p.Pick(t.Context(), &Request{}, tt.cands)
				if err != nil {
					t.Fatalf("Pick: %v", err)
				}
				if want := i % len(tt.cands); got != want {
					t.Fatalf("pick %d = %d, want %d", i, got, want)
				}
				counts[tt.cands[got].String()]++
			}
			checkEven(t, "round_robin", counts, len(tt.cands), tt.picks)
		})
	}
	p, _ := NewPolicy(PolicySpec{Name: "round_robin"})
	if _, err := p.Pick(t.Context(), &Request{}, nil); !errors.Is(err, ErrNoEndpoints) {
		t.Errorf("Pick(no candidates) = %v, want ErrNoEndpoints", err)
	}
}

func TestPoliciesAreIndependent(t *testing.T) {
	a, _ := NewPolicy(PolicySpec{Name: "round_robin"})
	b, _ := NewPolicy(PolicySpec{Name: "round_robin"})
	cands := []Candidate{{Target: Target{Rank: 0}}, {Target: Target{Rank: 1}}}
	_, _ = a.Pick(t.Context(), nil, cands)
	if got, _ := b.Pick(t.Context(), nil, cands); got != 0 {
		t.Errorf("a fresh policy started at index %d: policies share state", got)
	}
}
