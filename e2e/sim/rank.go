package sim

import (
	"net/http"
	"strconv"
	"strings"
)

// dpRankHeader is the header SGLang's OpenAI routes read the DP rank from.
const dpRankHeader = "X-Data-Parallel-Rank"

// rankSource says how a DP rank was chosen (Record.RankSource).
type rankSource string

// Rank sources.
const (
	sourceHeader     rankSource = "header"
	sourceBody       rankSource = "body"
	sourceRoom       rankSource = "room"
	sourceRoundRobin rankSource = "round_robin"
	// sourceLeastLoaded is vLLM's internal DP load balancing.
	sourceLeastLoaded rankSource = "least_loaded"
)

// pinnedRank is a rank the client asked for.
type pinnedRank struct {
	rank   int
	source rankSource
}

// explicitRank resolves the rank the client pinned, as SGLang v0.5.19 does:
// on the OpenAI routes the X-Data-Parallel-Rank header wins over the body's
// routed_dp_rank (a non-integer header is a 400); /generate ignores the
// header. Rank 0 on a dp_size<=1 server is ignored; any other rank outside
// [0, dp_size) is a 400. It returns nil when no rank is pinned.
func explicitRank(route routeKind, h http.Header, bodyRank *int, dpSize int) (*pinnedRank, *apiError) {
	var pin *pinnedRank
	if route.isOpenAI() {
		if vals := h.Values(dpRankHeader); len(vals) > 0 {
			r, err := strconv.Atoi(strings.TrimSpace(vals[0]))
			if err != nil {
				return nil, badRequestf("Invalid X-Data-Parallel-Rank header: must be an integer, got '%s'", vals[0])
			}
			pin = &pinnedRank{rank: r, source: sourceHeader}
		}
	}
	if pin == nil && bodyRank != nil {
		pin = &pinnedRank{rank: *bodyRank, source: sourceBody}
	}
	if pin == nil {
		return nil, nil
	}
	if dpSize <= 1 && pin.rank == 0 {
		return nil, nil
	}
	if pin.rank < 0 || pin.rank >= dpSize {
		return nil, badRequestf("routed_dp_rank=%d out of range [0, %d)", pin.rank, dpSize)
	}
	return pin, nil
}

// pyMod is Python's modulo: the result has the sign of the divisor, so a
// negative room still maps into [0, n).
func pyMod(a int64, n int) int {
	m := a % int64(n)
	if m < 0 {
		m += int64(n)
	}
	return int(m)
}

// chooseRank picks an item's rank on this server: the pinned rank if any;
// otherwise follow_bootstrap_room on prefill and round robin elsewhere.
func (s *Server) chooseRank(pin *pinnedRank, room *int64) (int, rankSource) {
	if pin != nil {
		return pin.rank, pin.source
	}
	if s.cfg.Mode == ModePrefill && room != nil {
		return pyMod(*room, s.cfg.DPSize), sourceRoom
	}
	if s.cfg.Flavor == FlavorVLLM {
		return s.leastLoadedRank(), sourceLeastLoaded
	}
	n := s.rr.Add(1) - 1
	return int(n % uint64(s.cfg.DPSize)), sourceRoundRobin
}
