package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// defaultWeights are the weighted policy's weights when the spec gives none:
// balance tokens and follow the prefix cache in equal measure.
var defaultWeights = map[string]float64{"tokens": 1, "prefix": 1}

// weighted scores every candidate as the weighted sum of the scorers'
// scores (see ScorerNames; each score is normalized to [0, 1]) and picks
// the highest total; ties go to the earliest candidate.
type weighted struct {
	// weights[s] is scorer s's weight.
	weights [numScorers]float64
}

func newWeighted(spec PolicySpec) (Policy, error) {
	ws := spec.Weights
	if ws == nil {
		ws = defaultWeights
	}
	if len(ws) == 0 {
		return nil, errors.New("weights: none given")
	}
	p := &weighted{}
	names := make([]string, 0, len(ws))
	for name := range ws {
		names = append(names, name)
	}
	slices.Sort(names) // report the same bad key every time
	sum := 0.0
	for _, name := range names {
		w := ws[name]
		s, ok := scorerByName(name)
		if !ok {
			return nil, fmt.Errorf("weight %q: unknown scorer (valid: %s)", name, strings.Join(ScorerNames(), ", "))
		}
		if math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
			return nil, fmt.Errorf("weight %q = %v: must be a finite number at least 0", name, w)
		}
		p.weights[s] = w
		sum += w
	}
	if !(sum > 0) || math.IsInf(sum, 0) {
		return nil, fmt.Errorf("weights %s: must have a positive, finite sum", strings.Join(names, ", "))
	}
	return p, nil
}

// Name implements Policy.
func (*weighted) Name() string { return policyWeighted }

// ReadsPrefix implements PrefixReader: only a prefix scorer with a weight
// reads the prefix index.
func (p *weighted) ReadsPrefix() bool { return p.weights[scorerPrefix] > 0 }

// Pick implements Policy.
func (p *weighted) Pick(_ context.Context, _ *Request, cands []Candidate) (int, error) {
	if len(cands) == 0 {
		return 0, noEndpoints(policyWeighted)
	}
	// The scorers are called directly rather than through a loop over the
	// active ones: this runs for every candidate of every request.
	wT, wP, wQ, wK := p.weights[scorerTokens], p.weights[scorerPrefix], p.weights[scorerQueue], p.weights[scorerKV]
	var st scoreStats
	if wT > 0 || wQ > 0 {
		st = collectStats(cands)
	}
	best, bestScore := 0, math.Inf(-1)
	for i := range cands {
		c := &cands[i]
		total := 0.0
		if wT > 0 {
			total += wT * scoreTokens(c, &st)
		}
		if wP > 0 {
			total += wP * c.Prefix
		}
		if wQ > 0 {
			total += wQ * scoreQueue(c, &st)
		}
		if wK > 0 {
			total += wK * scoreKV(c)
		}
		if total > bestScore {
			best, bestScore = i, total
		}
	}
	return best, nil
}
