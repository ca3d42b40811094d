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
	// invTokens is 1/max(Tokens), or 0 when all candidates carry the same
	// tokens (or none): then every tokens score is 1. invQueue likewise.
	invTokens, invQueue float64
}

// collectStats computes the aggregates over cands (not empty).
func collectStats(cands []Candidate) scoreStats {
	l0 := &cands[0].Load
	minT, maxT := l0.Tokens, l0.Tokens
	minQ, maxQ := l0.Running+l0.Waiting, l0.Running+l0.Waiting
	for i := 1; i < len(cands); i++ {
		l := &cands[i].Load
		minT = min(minT, l.Tokens)
		maxT = max(maxT, l.Tokens)
		q := l.Running + l.Waiting
		minQ = min(minQ, q)
		maxQ = max(maxQ, q)
	}
	var st scoreStats
	if maxT != minT && maxT > 0 {
		st.invTokens = 1 / float64(maxT)
	}
	if maxQ != minQ && maxQ > 0 {
		st.invQueue = 1 / float64(maxQ)
	}
	return st
}

// score rates c; st must come from collectStats over the same candidates.
func (s scorer) score(c *Candidate, st *scoreStats) float64 {
	switch s {
	case scorerTokens:
		return scoreTokens(c, st)
	case scorerPrefix:
		return c.Prefix
	case scorerQueue:
		return scoreQueue(c, st)
	case scorerKV:
		return scoreKV(c)
	}
	return 0
}

func scoreTokens(c *Candidate, st *scoreStats) float64 {
	if st.invTokens == 0 {
		return 1
	}
	return clamp01(1 - float64(c.Load.Tokens)*st.invTokens)
}

func scoreQueue(c *Candidate, st *scoreStats) float64 {
	if st.invQueue == 0 {
		return 1
	}
	return clamp01(1 - float64(c.Load.Running+c.Load.Waiting)*st.invQueue)
}

func scoreKV(c *Candidate) float64 {
	if c.Load.Capacity <= 0 {
		return 1
	}
	return clamp01(1 - float64(c.Load.Tokens)/float64(c.Load.Capacity))
}

// clamp01 clamps v to [0, 1].
func clamp01(v float64) float64 {
	switch {
	case v < 0:
		return 0
	case v > 1:
		return 1
	}
	return v
}
