package peers

import (
	"fmt"
	"testing"

	"github.com/duet-router/duet/scheduler"
)

// TestDynamoWorkedExample is the example of Dynamo's router guide
// (docs/components/router/router-guide.md, "Worker Selection", weight
// 1.0): prefill blocks 8, 5, 2 and decode blocks 10, 5, 9 cost 18, 10 and
// 11; the second worker wins.
func TestDynamoWorkedExample(t *testing.T) {
	for i, tt := range []struct{ prefill, decode, want float64 }{{8, 10, 18}, {5, 5, 10}, {2, 9, 11}} {
		if got := dynamoCost(tt.prefill, 0, tt.decode); got != tt.want {
			t.Errorf("worker %d: cost %v, want %v", i+1, got, tt.want)
		}
	}
	// The same through the policy (aggregated: both terms): a 32-token
	// prompt is 2 blocks; active prefill tokens 96, 48, 0 make the prefill
	// terms 8, 5, 2; active blocks 8, 3, 7 make the decode terms 10, 5, 9.
	p, _ := NewAggregated("dynamo_kv")
	d := p.(*dynamoKV)
	cands := []scheduler.Candidate{cand("http://w1", 0), cand("http://w2", 0), cand("http://w3", 0)}
	for i, s := range []struct{ prefill, blocks int64 }{{96, 8}, {48, 3}, {0, 7}} {
		d.activePrefill[cands[i].Key()] = s.prefill
		d.activeBlocks[cands[i].Key()] = s.blocks
	}
	if got := pick(t, p, &scheduler.Request{ID: "r", PromptTokens: 32}, cands); got != 1 {
		t.Errorf("picked worker %d, want worker 2 (cost 10)", got+1)
	}
	// Overlap credit: 4 cached blocks on worker 3 make its prefill term
	// max(2 - 4, 0) = 0, cost 9, below worker 1's 18 and worker 2's 14
	// (its pick above queued 32 prompt tokens and 2 blocks there).
	cands[2].CachedTokens = 64
	if got := pick(t, p, &scheduler.Request{ID: "s", PromptTokens: 32}, cands); got != 2 {
		t.Errorf("with 4 blocks cached on worker 3: picked worker %d, want 3", got+1)
	}
}

// TestDynamoPrefillRouter checks the PD prefill router: cost is the
// uncached prompt work queued on the rank plus this request's, in blocks;
// no decode blocks; the work leaves when the prefill leg ends.
func TestDynamoPrefillRouter(t *testing.T) {
	p, _ := New("dynamo_kv", scheduler.RolePrefill)
	d := p.(*dynamoKV)
	cands := []scheduler.Candidate{cand("http://a", 0), cand("http://b", 0)}
	cands[0].CachedTokens = 640 // 40 blocks of a 100-block prompt
	req := func(id string) *scheduler.Request { return &scheduler.Request{ID: id, PromptTokens: 1600} }
	var got []int
	for _, id := range []string{"1", "2", "3"} {
		got = append(got, pick(t, p, req(id), cands))
	}
	// 1: a = 100 - 40 = 60, b = 100: a (queues 960 uncached tokens).
	// 2: a = (960+1600)/16 - 40 = 120, b = 100: b (queues 1600).
	// 3: a = 120, b = (1600+1600)/16 = 200: a.
	if fmt.Sprint(got) != "[0 1 0]" {
		t.Errorf("picks %v, want [0 1 0]", got)
	}
	if a, b := d.activePrefill[cands[0].Key()], d.activePrefill[cands[1].Key()]; a != 1920 || b != 1600 {
		t.Errorf("active prefill tokens a=%d b=%d, want 1920, 1600", a, b)
	}
	if len(d.activeBlocks) != 0 {
		t.Errorf("prefill router tracked decode blocks: %v", d.activeBlocks)
	}
	// Both of a's prefills end: a is back to 60 against b's 200.
	d.ObserveLeg(leg("1", scheduler.RolePrefill, cands[0]))
	d.ObserveLeg(leg("3", scheduler.RolePrefill, cands[0]))
	if a := d.activePrefill[cands[0].Key()]; a != 0 {
		t.Errorf("a's active prefill after its legs ended: %d, want 0", a)
	}
	if got := pick(t, p, req("4"), cands); got != 0 {
		t.Errorf("after a's legs ended: picked %d, want 0", got)
	}
}

// TestDynamoDecodeRouter checks the PD decode router: overlap-blind, no
// prefill term, least active prompt blocks (each request its own
// floor(isl/16) blocks), released when the decode leg ends.
func TestDynamoDecodeRouter(t *testing.T) {
	p, _ := New("dynamo_kv", scheduler.RoleDecode)
	d := p.(*dynamoKV)
	cands := []scheduler.Candidate{cand("http://a", 0), cand("http://b", 0), cand("http://c", 0)}
	d.activeBlocks[cands[0].Key()] = 50
	d.activeBlocks[cands[1].Key()] = 10
	d.activeBlocks[cands[2].Key()] = 30
	cands[0].CachedTokens = 1 << 20 // ignored: overlap_score_credit = 0
	cands[0].Prefix = 1
	if got := pick(t, p, &scheduler.Request{ID: "r", PromptTokens: 335}, cands); got != 1 {
		t.Errorf("picked %d, want 1 (fewest active blocks)", got)
	}
	if b := d.activeBlocks[cands[1].Key()]; b != 30 { // 10 + floor(335/16)
		t.Errorf("b's active blocks %d, want 30", b)
	}
	if len(d.activePrefill) != 0 {
		t.Errorf("decode router tracked prefill tokens: %v", d.activePrefill)
	}
	d.ObserveLeg(leg("r", scheduler.RoleDecode, cands[1]))
	if b := d.activeBlocks[cands[1].Key()]; b != 10 {
		t.Errorf("b's active blocks after the leg ended: %d, want 10", b)
	}
}

// TestDynamoTiesAreRandom checks Dynamo's zero-temperature tie rule: equal
// costs go to a uniformly random rank, not always the first, and the
// port's draws are reproducible.
func TestDynamoTiesAreRandom(t *testing.T) {
	cands := []scheduler.Candidate{cand("http://a", 0), cand("http://b", 0), cand("http://c", 0)}
	draw := func() (seq []int) {
		p, _ := New("dynamo_kv", scheduler.RoleDecode)
		for i := range 60 {
			// A 15-token prompt is 0 blocks: every cost stays 0.
			seq = append(seq, pick(t, p, &scheduler.Request{ID: fmt.Sprint(i), PromptTokens: 15}, cands))
		}
		return seq
	}
	seen := reproducibleChoices(t, draw)
	if len(seen) != 3 {
		t.Errorf("choices %v: want all three tied ranks", seen)
	}
}
