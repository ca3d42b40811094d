package scheduler

import "slices"

// A scorer rates a candidate between 0 (worst) and 1 (best) for the
// weighted policy. Scores that are relative to the other candidates read
// the candidates' aggregates from scoreStats.
type scorer int

// The scorers.
const (
	// scorerTokens is 1 - Tokens/max(Tokens) over the candidates; 1 for
	// every candidate when all carry the same tokens.
	scorerTokens scorer = iota
	// scorerPrefix is Candidate.Prefix as is.
	scorerPrefix
	// scorerQueue is 1 - (Running+Waiting)/max(Running+Waiting); 1 for every
	// candidate when all queues are the same length.
	scorerQueue
	// scorerKV is the free share of the rank's KV capacity,
	// 1 - Tokens/Capacity clamped to [0, 1]; 1 when the capacity is unknown.
	scorerKV
	numScorers
)

// scorerNames are the scorers' names, indexed by scorer.
var scorerNames = [numScorers]string{
	scorerTokens: "tokens",
	scorerPrefix: "prefix",
	scorerQueue:  "queue",
	scorerKV:     "kv",
}

// ScorerNames lists the scorer names the weighted policy accepts, sorted.
func ScorerNames() []string {
	names := slices.Clone(scorerNames[:])
	slices.Sort(names)
	return names
}

// scorerByName returns the scorer called name.
func scorerByName(name string) (scorer, bool) {
	for s, n := range scorerNames {
		if n == name {
			return scorer(s), true
		}
	}
	return 0, false
}

// String returns the scorer's name.
func (s scorer) String() string { return scorerNames[s] }

// scoreStats are the candidate aggregates the relative scorers need.
type scoreStats struct {
	minTokens, maxTokens int64
	minQueue, maxQueue   int
}

// collectStats computes the aggregates over cands (not empty).
func collectStats(cands []Candidate) scoreStats {
	q0 := cands[0].Load.Running + cands[0].Load.Waiting
	st := scoreStats{
		minTokens: cands[0].Load.Tokens, maxTokens: cands[0].Load.Tokens,
		minQueue: q0, maxQueue: q0,
	}
	for i := 1; i < len(cands); i++ {
		l := &cands[i].Load
		st.minTokens = min(st.minTokens, l.Tokens)
		st.maxTokens = max(st.maxTokens, l.Tokens)
		q := l.Running + l.Waiting
		st.minQueue = min(st.minQueue, q)
		st.maxQueue = max(st.maxQueue, q)
	}
	return st
}

// score rates c; st must come from collectStats over the same candidates.
func (s scorer) score(c *Candidate, st *scoreStats) float64 {
	switch s {
	case scorerTokens:
		if st.maxTokens == st.minTokens || st.maxTokens <= 0 {
			return 1
		}
		return clamp01(1 - float64(c.Load.Tokens)/float64(st.maxTokens))
	case scorerPrefix:
		return c.Prefix
	case scorerQueue:
		if st.maxQueue == st.minQueue || st.maxQueue <= 0 {
			return 1
		}
		return clamp01(1 - float64(c.Load.Running+c.Load.Waiting)/float64(st.maxQueue))
	case scorerKV:
		if c.Load.Capacity <= 0 {
			return 1
		}
		return clamp01(1 - float64(c.Load.Tokens)/float64(c.Load.Capacity))
	}
	return 0
}

// clamp01 clamps v to [0, 1].
func clamp01(v float64) float64 {
	return min(max(v, 0), 1)
}
