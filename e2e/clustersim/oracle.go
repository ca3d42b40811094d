package clustersim

import (
	"github.com/duet-router/duet/e2e/sim"
)

// oracleRoute chooses q's ranks from the engines' true state.
func (r *run) oracleRoute(q *request) {
	if len(r.prefill) > 0 {
		q.pEng, q.pRank = r.pickPrefill()
	}
	q.dEng, q.dRank = r.pickDecode()
}

// rankRef is one rank of one engine.
type rankRef struct {
	e    *engine
	rank int
}

// pickPrefill is the prefill oracle: the least true pending prefill work.
// Ranks are visited rank-major, as the scheduler lists candidates, so that
// ties spread over engines.
func (r *run) pickPrefill() (*engine, int) {
	refs, loads := r.rankLoads(r.prefill, func(st sim.RankState) int64 { return int64(st.PendingPrefill) })
	i := argmin(loads)
	return refs[i].e, refs[i].rank
}

// pickDecode is the decode oracle: the least KV in use and promised (the
// KV of queued requests and their outputs).
func (r *run) pickDecode() (*engine, int) {
	refs, loads := r.rankLoads(r.decode, func(st sim.RankState) int64 { return int64(st.UsedTokens + st.Promised) })
	i := argmin(loads)
	return refs[i].e, refs[i].rank
}

// rankLoads lists pool's ranks rank-major with load(state) of each.
func (r *run) rankLoads(pool []*engine, load func(sim.RankState) int64) ([]rankRef, []int64) {
	states := make([][]sim.RankState, len(pool))
	maxDP := 0
	for i, e := range pool {
		states[i] = e.model.Ranks(r.now)
		maxDP = max(maxDP, e.dp)
	}
	var refs []rankRef
	var loads []int64
	for k := range maxDP {
		for i, e := range pool {
			if k < e.dp {
				refs = append(refs, rankRef{e: e, rank: k})
				loads = append(loads, load(states[i][k]))
			}
		}
	}
	return refs, loads
}

// argmin returns the index of the first smallest value.
func argmin(xs []int64) int {
	best := 0
	for i, x := range xs {
		if x < xs[best] {
			best = i
		}
	}
	return best
}
