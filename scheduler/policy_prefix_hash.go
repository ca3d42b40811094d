package scheduler

import (
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
	key := prefixHashKey(req)

	p.mu.Lock()
	defer p.mu.Unlock()
	sum := p.ring.sync(cands)
	limit := p.loadFactor*float64(sum)/float64(n) + 1
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
// String() values (in order) changed, and returns the candidates' total
// tokens (one pass over cands does both).
func (r *hashRing) sync(cands []Candidate) (sum int64) {
	same := len(cands) == len(r.targets)
	for i := range cands {
		c := &cands[i]
		sum += c.Load.Tokens
		if !same || c.Target == r.targets[i] {
			continue
		}
		if c.Target.String() == r.keys[i] {
			r.targets[i] = c.Target // the same target in a newer snapshot
		} else {
			same = false
		}
	}
	if !same {
		r.build(cands)
	}
	return sum
}

// build lays out prefixHashVNodes points per candidate and sorts them.
func (r *hashRing) build(cands []Candidate) {
	clear(r.targets[:cap(r.targets)]) // let dropped endpoints go
	r.targets = r.targets[:0]
	r.keys = r.keys[:0]
	m := len(cands) * prefixHashVNodes
	r.points = slices.Grow(r.points[:0], m)
	r.owners = slices.Grow(r.owners[:0], m)
	for i := range cands {
		t := cands[i].Target
		key := t.String()
		r.targets = append(r.targets, t)
		r.keys = append(r.keys, key)
		base := policyHashString(key)
		for v := range uint64(prefixHashVNodes) {
			r.points = append(r.points, policyMix64(base+v*policyGolden))
			r.owners = append(r.owners, int32(i))
		}
	}
	// The points were laid out by owner, and the sort is stable: points at
	// the same position stay in owner order.
	radixSortRing(r.points, r.owners, make([]uint64, m), make([]int32, m))
	r.builds++
}

// radixSortRing sorts points ascending, moving owners along, with a stable
// LSD radix sort: the sort of a large ring is several times faster than a
// comparison sort. tmpP and tmpO are scratch space of the same length.
func radixSortRing(points []uint64, owners []int32, tmpP []uint64, tmpO []int32) {
	const bits = 8
	srcP, srcO, dstP, dstO := points, owners, tmpP, tmpO
	for shift := 0; shift < 64; shift += bits {
		var count [1 << bits]int
		for _, p := range srcP {
			count[p>>shift&(1<<bits-1)]++
		}
		sum := 0
		for d, c := range count {
			count[d] = sum
			sum += c
		}
		for i, p := range srcP {
			d := p >> shift & (1<<bits - 1)
			dstP[count[d]] = p
			dstO[count[d]] = srcO[i]
			count[d]++
		}
		srcP, srcO, dstP, dstO = dstP, dstO, srcP, srcO
	}
	// 64/bits passes is even: the result is back in points and owners.
}
