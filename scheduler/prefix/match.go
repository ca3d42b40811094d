package prefix

// matchScratch is the per-call working memory of Match, pooled per Index.
type matchScratch[K comparable] struct {
	results []result[K]
	seen    []uint64 // bitset over target slots
}

type result[K comparable] struct {
	key     K
	matched int
}

// Match calls fn once for every target whose cache holds a leading run of
// blocks, with the length of that run (number of leading blocks matched,
// >= 1). Targets are reported longest match first. fn runs after the index
// lock is released, so it may call any Index method.
//
// Match relies on what [Index.Insert] guarantees: what a target holds is
// closed under prefixes, so the targets holding blocks[i+1] are a subset of
// those holding blocks[i], and a target holding blocks[i] holds the whole
// run blocks[:i+1]. The holder counts along the prompt therefore never
// grow, and only the positions where they drop matter: Match finds the last
// held block and then each drop by binary search, and lists holders only at
// those positions. For a prompt of n blocks with d distinct match lengths
// among c matching targets it does O(d·log n) map lookups and lists the
// holders of d blocks, at most d·c entries, instead of O(n·c) work for a
// block-by-block intersection. The common cases — a shared system prompt
// plus a few targets holding the conversation — have small d; the worst
// case (every target at a different depth) costs a few milliseconds at 8192
// targets.
func (x *Index[K]) Match(blocks []uint64, fn func(key K, matched int)) {
	if len(blocks) == 0 {
		return
	}
	s, _ := x.scratch.Get().(*matchScratch[K])
	if s == nil {
		s = new(matchScratch[K])
	}

	x.mu.RLock()
	x.collect(blocks, s)
	x.mu.RUnlock()

	for _, r := range s.results {
		fn(r.key, r.matched)
	}
	clear(s.results) // drop references held by keys
	s.results = s.results[:0]
	x.scratch.Put(s)
}

// collect fills s.results for blocks. The caller holds the read lock.
func (x *Index[K]) collect(blocks []uint64, s *matchScratch[K]) {
	if _, ok := x.nodes.get(blocks[0]); !ok {
		return
	}

	// The last held block: presence is true on a prefix of blocks.
	lo, hi := 0, len(blocks) // present(lo), !present(hi)
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if _, ok := x.nodes.get(blocks[mid]); ok {
			lo = mid
		} else {
			hi = mid
		}
	}

	words := (len(x.targets) + 63) / 64
	if cap(s.seen) < words {
		s.seen = make([]uint64, words)
	}
	seen := s.seen[:words]
	defer clear(seen)

	for i := lo; i >= 0; {
		n, ok := x.nodes.get(blocks[i])
		if !ok { // only if prefix closure was broken (misuse, collision)
			i--
			continue
		}
		nd := &x.slab[n]
		c := nd.len()

		// Start of the run of blocks held by exactly these holders: the
		// smallest j <= i with count(j) <= c (counts never grow with i).
		lo, hi := -1, i // count(lo) > c, count(hi) <= c
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			if x.count(blocks[mid]) <= c {
				hi = mid
			} else {
				lo = mid
			}
		}

		for k := range nd.n {
			h := nd.at(k)
			w, b := h.slot/64, uint64(1)<<(h.slot%64)
			if seen[w]&b != 0 {
				continue
			}
			seen[w] |= b
			s.results = append(s.results, result[K]{key: x.keys[h.slot], matched: i + 1})
		}
		i = hi - 1
	}
}

// count returns how many targets hold hash.
func (x *Index[K]) count(hash uint64) int {
	if n, ok := x.nodes.get(hash); ok {
		return x.slab[n].len()
	}
	return 0
}
