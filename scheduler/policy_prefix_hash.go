package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
)

const (
	// defaultLoadFactor is prefix_hash's default load bound.
	defaultLoadFactor = 1.25
	// prefixHashBlocks is how many leading prompt blocks form a request's
	// key: requests that share these blocks share a target.
	prefixHashBlocks = 4
	// prefixHashVNodes is the number of points each target has on the ring.
	// It is the same for every pool size, so that a target's points do not
	// move when other targets come and go.
	prefixHashVNodes = 32
)

// prefixHash is consistent hashing with bounded loads. A request's key is
// the hash of its first prefixHashBlocks prefix blocks (Request.Blocks), or
// of its ID when it has no blocks. The key is placed on a ring that holds
// prefixHashVNodes points per candidate, each derived from the target's
// String(); the walk goes clockwise from the key and takes the first
// candidate whose tokens are at most LoadFactor times the mean over the
// candidates, plus one token (so that an idle pool accepts everywhere). If
// no candidate qualifies, the least-loaded one wins.
//
// Requests with the same prefix therefore land on the same target, whose
// radix cache holds that prefix, as long as the target is not overloaded;
// when a target joins or leaves, only the keys on its arcs move. The ring
// is a pure function of the candidates' String() values, so all duet
// replicas agree on it.
//
// The ring is cached and rebuilt only when the candidate set changes. The
// check is exact and costs one comparison per candidate: the policy keeps
// the targets it last saw (keeping their immutable endpoints alive) and
// compares pointer and rank; only a candidate whose endpoint pointer
// changed (a new snapshot) has its String() compared.
type prefixHash struct {
	loadFactor float64

	mu   sync.Mutex
	ring hashRing
}

// hashRing is prefixHash's cached ring.
type hashRing struct {
	targets []Target // the candidates the ring was built or last checked for
	keys    []string // their String() values
	points  []uint64 // ring positions, ascending
	owners  []int32  // owners[i]: the candidate index of points[i]
	builds  int      // how often the ring was built (tests)
}

func newPrefixHash(spec PolicySpec) (Policy, error) {
	f := spec.LoadFactor
	switch {
	case f == 0:
		f = defaultLoadFactor
	case math.IsNaN(f) || f < 1:
		return nil, fmt.Errorf("load factor %v: must be at least 1", spec.LoadFactor)
	}
	return &prefixHash{loadFactor: f}, nil
}

// Name implements Policy.
func (*prefixHash) Name() string { return policyPrefixHash }

// Pick implements Policy.
func (p *prefixHash) Pick(_ context.Context, req *Request, cands []Candidate) (int, error) {
	n := len(cands)
	if n == 0 {
		return 0, noEndpoints(policyPrefixHash)
	}
	if n == 1 {
		return 0, nil
	}
	var sum int64
	for i := range cands {
		sum += cands[i].Load.Tokens
	}
	limit := p.loadFactor*float64(sum)/float64(n) + 1
	key := prefixHashKey(req)

	p.mu.Lock()
	defer p.mu.Unlock()
	p.ring.sync(cands)
	points, owners := p.ring.points, p.ring.owners
	start, _ := slices.BinarySearch(points, key)
	for k := range points {
		pos := start + k
		if pos >= len(points) {
			pos -= len(points)
		}
		if o := owners[pos]; float64(cands[o].Load.Tokens) <= limit {
			return int(o), nil
		}
	}
	return argminTokens(cands), nil
}

// prefixHashKey returns the ring key of req: the hash of its first
// prefixHashBlocks blocks, or of its ID when it has none.
func prefixHashKey(req *Request) uint64 {
	if req == nil {
		return policyHashString("")
	}
	blocks := req.Blocks
	if len(blocks) == 0 {
		return policyHashString(req.ID)
	}
	if len(blocks) > prefixHashBlocks {
		blocks = blocks[:prefixHashBlocks]
	}
	h := uint64(len(blocks))
	for _, b := range blocks {
		h = policyMix64(h*policyGolden ^ b)
	}
	return h
}

// sync makes the ring match cands, rebuilding it if the candidates'
// String() values (in order) changed.
func (r *hashRing) sync(cands []Candidate) {
	if len(cands) == len(r.targets) {
		same := true
		for i := range cands {
			t := cands[i].Target
			if t == r.targets[i] {
				continue
			}
			if t.String() != r.keys[i] {
				same = false
				break
			}
			r.targets[i] = t // same target in a newer snapshot
		}
		if same {
			return
		}
	}
	r.build(cands)
}

// build lays out prefixHashVNodes points per candidate and sorts them.
func (r *hashRing) build(cands []Candidate) {
	type point struct {
		pos   uint64
		owner int32
	}
	pts := make([]point, 0, len(cands)*prefixHashVNodes)
	clear(r.targets[:cap(r.targets)]) // let dropped endpoints go
	r.targets = r.targets[:0]
	r.keys = r.keys[:0]
	for i := range cands {
		t := cands[i].Target
		key := t.String()
		r.targets = append(r.targets, t)
		r.keys = append(r.keys, key)
		base := policyHashString(key)
		for v := range uint64(prefixHashVNodes) {
			pts = append(pts, point{pos: policyMix64(base + v*policyGolden), owner: int32(i)})
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		if c := cmp.Compare(a.pos, b.pos); c != 0 {
			return c
		}
		return cmp.Compare(a.owner, b.owner)
	})
	r.points = slices.Grow(r.points[:0], len(pts))
	r.owners = slices.Grow(r.owners[:0], len(pts))
	for _, pt := range pts {
		r.points = append(r.points, pt.pos)
		r.owners = append(r.owners, pt.owner)
	}
	r.builds++
}
