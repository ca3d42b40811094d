package peers

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/scheduler"
)

// engines caches one Endpoint per URL so that a test's candidates of one
// engine share it, as the scheduler's do.
var engines = map[string]*scheduler.Endpoint{}

// cand returns a candidate for url's rank.
func cand(url string, rank int) scheduler.Candidate {
	ep, ok := engines[url]
	if !ok {
		ep = &scheduler.Endpoint{URL: url, Ready: true}
		engines[url] = ep
	}
	return scheduler.Candidate{Target: scheduler.Target{Endpoint: ep, Rank: rank}}
}

// pick runs p.Pick and fails the test on error.
func pick(t *testing.T, p scheduler.Policy, req *scheduler.Request, cands []scheduler.Candidate) int {
	t.Helper()
	i, err := p.Pick(context.Background(), req, cands)
	if err != nil {
		t.Fatalf("%s: Pick: %v", p.Name(), err)
	}
	if i < 0 || i >= len(cands) {
		t.Fatalf("%s: Pick = %d, out of %d candidates", p.Name(), i, len(cands))
	}
	return i
}

// leg is the report of the leg of request id placed on c.
func leg(id string, role scheduler.Role, c scheduler.Candidate) scheduler.LegReport {
	return scheduler.LegReport{RequestID: id, Role: role, Target: c.Key(), Picked: time.Unix(0, 0), Ended: time.Unix(1, 0)}
}

func TestNamesAndNew(t *testing.T) {
	want := []string{"smg_cache_aware", "smg_dp_min_tokens", "dynamo_kv", "llmd_epp"}
	if got := Names(); !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	cands := []scheduler.Candidate{cand("http://a", 0), cand("http://b", 0)}
	for _, name := range Names() {
		for _, role := range []scheduler.Role{scheduler.RolePrefill, scheduler.RoleDecode} {
			p, err := New(name, role)
			if err != nil {
				t.Fatalf("New(%q, %q): %v", name, role, err)
			}
			if p.Name() != name {
				t.Errorf("New(%q, %q).Name() = %q", name, role, p.Name())
			}
			if _, ok := p.(scheduler.PrefixReader); !ok {
				t.Errorf("%s/%s: not a PrefixReader", name, role)
			}
			pick(t, p, &scheduler.Request{ID: "r", PromptTokens: 100, Now: time.Unix(0, 0)}, cands)
			if _, err := p.Pick(context.Background(), &scheduler.Request{}, nil); err == nil {
				t.Errorf("%s/%s: Pick with no candidates: no error", name, role)
			}
		}
	}
	for _, tt := range []struct {
		name string
		role scheduler.Role
		err  string
	}{
		{"nginx", scheduler.RoleDecode, "unknown peer"},
		{"dynamo_kv", scheduler.Role("encode"), "role"},
		{"smg_cache_aware", scheduler.Role(""), "role"},
	} {
		if _, err := New(tt.name, tt.role); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("New(%q, %q) error = %v, want one containing %q", tt.name, tt.role, err, tt.err)
		}
	}
	if _, err := NewAggregated("smg_dp_min_tokens"); err == nil {
		t.Error("NewAggregated(smg_dp_min_tokens): no error; SMG has it in PD mode only")
	}
	for _, name := range []string{"smg_cache_aware", "dynamo_kv", "llmd_epp"} {
		if _, err := NewAggregated(name); err != nil {
			t.Errorf("NewAggregated(%q): %v", name, err)
		}
	}
	if _, _, err := NewPair("nginx"); err == nil {
		t.Error("NewPair(nginx): no error")
	}
}

// TestReadsPrefix checks which ports ask the scheduler for prefix matches:
// all but Dynamo's decode router, which is overlap-blind.
func TestReadsPrefix(t *testing.T) {
	for _, tt := range []struct {
		name string
		role scheduler.Role
		want bool
	}{
		{"smg_cache_aware", scheduler.RolePrefill, true},
		{"smg_cache_aware", scheduler.RoleDecode, true},
		{"smg_dp_min_tokens", scheduler.RoleDecode, true},
		{"dynamo_kv", scheduler.RolePrefill, true},
		{"dynamo_kv", scheduler.RoleDecode, false},
		{"llmd_epp", scheduler.RolePrefill, true},
		{"llmd_epp", scheduler.RoleDecode, true},
	} {
		p, err := New(tt.name, tt.role)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.(scheduler.PrefixReader).ReadsPrefix(); got != tt.want {
			t.Errorf("%s/%s: ReadsPrefix() = %v, want %v", tt.name, tt.role, got, tt.want)
		}
	}
}

// TestInstancesAreIndependent checks that New returns a fresh state each
// call: picks on one instance do not move another's counts.
func TestInstancesAreIndependent(t *testing.T) {
	cands := []scheduler.Candidate{cand("http://a", 0), cand("http://b", 0)}
	for _, name := range Names() {
		p1, _ := New(name, scheduler.RoleDecode)
		p2, _ := New(name, scheduler.RoleDecode)
		for i := range 3 {
			req := &scheduler.Request{ID: string(rune('a' + i)), PromptTokens: 320, Now: time.Unix(0, 0)}
			pick(t, p1, req, cands[:1])
		}
		switch p2 := p2.(type) {
		case *smgPolicy:
			if len(p2.load) != 0 || len(p2.processed) != 0 || len(p2.ranks.loads) != 0 {
				t.Errorf("%s: fresh instance has state %v %v %v", name, p2.load, p2.processed, p2.ranks.loads)
			}
			if p1.(*smgPolicy).load[p2.workerKey(cands[0].Key())] != 3 {
				t.Errorf("%s: loaded instance: load %v, want 3 on a", name, p1.(*smgPolicy).load)
			}
		case *dynamoKV:
			if len(p2.activeBlocks) != 0 || len(p2.activePrefill) != 0 {
				t.Errorf("%s: fresh instance has state %v %v", name, p2.activeBlocks, p2.activePrefill)
			}
			if got := p1.(*dynamoKV).activeBlocks[cands[0].Key()]; got != 60 {
				t.Errorf("%s: loaded instance: %d active blocks on a, want 60", name, got)
			}
		case *llmdEPP: // stateless but for its tie-breaking generator
			if p1.(*llmdEPP) == p2 {
				t.Errorf("%s: New returned the same instance twice", name)
			}
		default:
			t.Errorf("%s: unexpected type %T", name, p2)
		}
	}
}

func TestWords(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"   ", 0},
		{"one", 1},
		{"user\nhello world\n", 3},
		{"  a  b\t\tc\r\nd ", 4},
		{"héllo wörld", 2},
		{"a\u00a0b", 2}, // no-break space is White_Space
		{"a\u3000b c", 3},
	} {
		if got := words([]byte(tt.in)); got != tt.want {
			t.Errorf("words(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestHolds(t *testing.T) {
	a, b := cand("http://a", 0).Key(), cand("http://b", 0).Key()
	h := newHolds[int64]()
	h.add("r1", a, 10)
	h.add("", a, 20)   // no ID: queued on a
	h.add("r1", a, 30) // ID already in flight: queued on a
	h.add("r2", b, 40)
	rep := func(id string, t scheduler.TargetKey) scheduler.LegReport {
		return scheduler.LegReport{RequestID: id, Target: t}
	}
	for _, tt := range []struct {
		r    scheduler.LegReport
		want int64
		ok   bool
	}{
		{rep("r1", a), 10, true},
		{rep("anonymous-7", a), 20, true}, // oldest queued on a
		{rep("r2", a), 30, true},          // r2 is on b: falls back to a's queue
		{rep("anonymous-8", a), 0, false},
		{rep("r2", b), 40, true},
		{rep("r2", b), 0, false},
	} {
		v, ok := h.take(tt.r)
		if v != tt.want || ok != tt.ok {
			t.Errorf("take(%v) = %d, %v; want %d, %v", tt.r, v, ok, tt.want, tt.ok)
		}
	}
}

// reproducibleChoices calls draw twice, fails unless both sequences of
// choices are equal (random ties must be reproducible), and returns how
// often each choice was drawn.
func reproducibleChoices(t *testing.T, draw func() []int) map[int]int {
	t.Helper()
	a, b := draw(), draw()
	seen := map[int]int{}
	for i, x := range a {
		seen[x]++
		if b[i] != x {
			t.Fatalf("draw %d: %d then %d: not reproducible", i, x, b[i])
		}
	}
	return seen
}
