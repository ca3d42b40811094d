package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/duet-router/duet/e2e/bench"
	"github.com/duet-router/duet/e2e/clustersim"
)

// The admission comparison's classes and tenants, as the workloads name
// them (bench.Session.Class and Tenant).
const (
	classInteractive = "interactive"
	classBatch       = "batch"
	noisyTenant      = "noisy"
)

// Shapes of the admission workloads' requests: interactive requests are
// short-ish chat turns, batch ones longer prompts with longer answers;
// the tenants of the noisy-tenant mix all send the variable workload's
// requests (1.5k-4k tokens in, 200-1,500 out).
var (
	interactiveShape = bench.VariableParams{Prompt: bench.IntRange{Min: 300, Max: 1500}, Output: bench.IntRange{Min: 50, Max: 300}}
	batchShape       = bench.VariableParams{Prompt: bench.IntRange{Min: 2000, Max: 6000}, Output: bench.IntRange{Min: 100, Max: 800}}
	tenantShape      = bench.VariableParams{}
)

// The mixes' proportions: interactive requests are this share of the
// classes mix; the noisy tenant sends noisyFactor times the requests (and
// so the tokens) of each of the normalTenants others.
const (
	interactiveShare = 0.2
	normalTenants    = 4
	noisyFactor      = 10
)

// loadShape scales a mix's rate over time: a constant factor of the pool's
// goodput rate, or bursts of High for BurstLen at the start of every Period
// and Low between them.
type loadShape struct {
	High, Low        float64
	Period, BurstLen time.Duration
}

// constant is a load shape of factor k all the time.
func constant(k float64) loadShape { return loadShape{High: k, Low: k} }

// peak is the shape's highest factor.
func (l loadShape) peak() float64 { return max(l.High, l.Low) }

// at is the factor at time t.
func (l loadShape) at(t time.Duration) float64 {
	if l.Period <= 0 || t%l.Period < l.BurstLen {
		return l.High
	}
	return l.Low
}

// mean is the shape's time-averaged factor.
func (l loadShape) mean() float64 {
	if l.Period <= 0 {
		return l.High
	}
	f := float64(l.BurstLen) / float64(l.Period)
	return f*l.High + (1-f)*l.Low
}

// String describes the shape, e.g. "2× constant" or "3× for 15s of every
// 1m0s, 0.5× between".
func (l loadShape) String() string {
	if l.Period <= 0 || l.High == l.Low {
		return strconv.FormatFloat(l.High, 'g', -1, 64) + "× constant"
	}
	return fmt.Sprintf("%g× for %v of every %v, %g× between", l.High, l.BurstLen, l.Period, l.Low)
}

// shaped builds the sessions of a mix at rate × the shape's peak, then
// keeps each with probability shape(start)/peak (a seeded thinning of the
// arrivals, which gives the shaped Poisson process for Poisson arrivals).
func shaped(build func(rate float64, window time.Duration, seed uint64) (bench.Workload, error),
	rate float64, shape loadShape, window time.Duration, seed uint64) (bench.Workload, error) {
	peak := shape.peak()
	w, err := build(rate*peak, window, seed)
	if err != nil {
		return w, err
	}
	if shape.Period <= 0 {
		return w, nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x7468696e)) // "thin"
	kept := w.Sessions[:0]
	for _, s := range w.Sessions {
		if rng.Float64()*peak < shape.at(s.Start) {
			kept = append(kept, s)
		}
	}
	w.Sessions = renumber(kept)
	w.Rate = rate * shape.mean()
	return w, nil
}

// part is one stream of a mixed workload: its share of the rate, the
// shape of its requests, and the class and tenant it sends.
type part struct {
	share         float64
	shape         bench.VariableParams
	class, tenant string
}

// mixed generates each part as an independent Poisson stream of
// independent requests (bench's variable workload, seeded per part) and
// merges them by arrival.
func mixed(name string, parts []part) func(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
	return func(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
		out := bench.Workload{Name: name, Rate: rate, Window: window, StreamFraction: 1}
		for i, p := range parts {
			w, err := bench.Generate(bench.WorkloadVariable, rate*p.share, window, seed*64+uint64(i), bench.Params{Variable: p.shape})
			if err != nil {
				return out, fmt.Errorf("%s part %d: %w", name, i, err)
			}
			for _, s := range w.Sessions {
				s.Class, s.Tenant = p.class, p.tenant
				out.Sessions = append(out.Sessions, s)
			}
		}
		slices.SortStableFunc(out.Sessions, func(a, b bench.Session) int { return cmpDuration(a.Start, b.Start) })
		out.Sessions = renumber(out.Sessions)
		return out, nil
	}
}

// cmpDuration orders durations.
func cmpDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// renumber numbers sessions in order, as a workload's IDs are.
func renumber(ss []bench.Session) []bench.Session {
	for i := range ss {
		ss[i].ID = i
	}
	return ss
}

// classesMix is 20 % interactive and 80 % batch requests, one tenant per
// class.
var classesMix = mixed("classes", []part{
	{share: interactiveShare, shape: interactiveShape, class: classInteractive, tenant: classInteractive},
	{share: 1 - interactiveShare, shape: batchShape, class: classBatch, tenant: classBatch},
})

// tenantsMix is four tenants and a noisy one that sends ten times the
// requests of each, all of one shape and of the batch class.
var tenantsMix = func() func(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
	total := float64(normalTenants + noisyFactor)
	parts := []part{{share: noisyFactor / total, shape: tenantShape, class: classBatch, tenant: noisyTenant}}
	for i := range normalTenants {
		parts = append(parts, part{share: 1 / total, shape: tenantShape, class: classBatch, tenant: "tenant-" + strconv.Itoa(i+1)})
	}
	return mixed("tenants", parts)
}()

// classedTrace replays the trace at path (traceReplay: rate is the time
// compression) and makes a seeded 20 % of its requests interactive, the
// rest batch.
func classedTrace(path string) func(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
	replay := traceReplay(path)
	return func(rate float64, window time.Duration, seed uint64) (bench.Workload, error) {
		w, err := replay(rate, window, seed)
		if err != nil {
			return w, err
		}
		rng := rand.New(rand.NewPCG(seed, 0x636c6173)) // "clas"
		for i := range w.Sessions {
			w.Sessions[i].Class, w.Sessions[i].Tenant = classBatch, classBatch
			if rng.Float64() < interactiveShare {
				w.Sessions[i].Class, w.Sessions[i].Tenant = classInteractive, classInteractive
			}
		}
		return w, nil
	}
}

// without returns w less the sessions of class or tenant drop (a baseline
// of the others alone: the same arrivals and prompts).
func without(w bench.Workload, drop string) bench.Workload {
	out := w
	out.Sessions = nil
	for _, s := range w.Sessions {
		if s.Class != drop && s.Tenant != drop {
			out.Sessions = append(out.Sessions, s)
		}
	}
	out.Sessions = renumber(out.Sessions)
	return out
}

// admissionSLO is the per-request SLO of the synthetic mixes: the matrix's
// p99 TTFT and mean TPOT bounds, held by each request.
func (o options) admissionSLO() clustersim.SLO {
	return clustersim.SLO{TTFT: o.sloTTFTP99, TPOT: o.sloTPOTMean}
}
