package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// estimate is a mean over seeds with its 95 % Student-t interval. A
// value that is infinite on some seed (a p99 TTFT where more than 1 % of
// the requests were not served) makes the whole estimate infinite, and
// Infinite counts those seeds.
type estimate struct {
	Mean, Lo, Hi float64
	N, Infinite  int
}

// tQuantiles are the 97.5th percentiles of Student's t for 1 to 30
// degrees of freedom; beyond, the normal's 1.96.
var tQuantiles = []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}

// tQuantile is the 97.5th percentile of Student's t with df degrees of
// freedom.
func tQuantile(df int) float64 {
	if df >= 1 && df <= len(tQuantiles) {
		return tQuantiles[df-1]
	}
	return 1.96
}

// meanOf estimates the mean of xs, one value per seed.
func meanOf(xs []float64) estimate {
	e := estimate{N: len(xs)}
	if e.N == 0 {
		return e
	}
	sum := 0.0
	for _, x := range xs {
		if math.IsInf(x, 0) || math.IsNaN(x) {
			e.Infinite++
		}
		sum += x
	}
	if e.Infinite > 0 {
		inf := math.Inf(1)
		e.Mean, e.Lo, e.Hi = inf, inf, inf
		return e
	}
	e.Mean = sum / float64(e.N)
	if e.N < 2 {
		e.Lo, e.Hi = e.Mean, e.Mean
		return e
	}
	ss := 0.0
	for _, x := range xs {
		ss += (x - e.Mean) * (x - e.Mean)
	}
	half := tQuantile(e.N-1) * math.Sqrt(ss/float64(e.N-1)/float64(e.N))
	e.Lo, e.Hi = e.Mean-half, e.Mean+half
	return e
}

// ratioOf is x/base, seed by seed: equal values (both zero, both
// infinite) give 1, an infinite or positive x over a zero base +Inf.
func ratioOf(x, base []float64) estimate {
	rs := make([]float64, len(x))
	for i := range x {
		switch {
		case x[i] == base[i]:
			rs[i] = 1
		case base[i] == 0 || math.IsInf(x[i], 1):
			rs[i] = math.Inf(1)
		default:
			rs[i] = x[i] / base[i]
		}
	}
	return meanOf(rs)
}

// Verdicts of an estimate against a reference, as ci's.
func (e estimate) compare(ref float64, lowerIsBetter bool) string {
	switch {
	case e.N == 0:
		return "no data"
	case e.Lo <= ref && ref <= e.Hi:
		return "no difference"
	case (e.Hi < ref) == lowerIsBetter:
		return "better"
	}
	return "worse"
}

// format writes the estimate as "412 [398, 425]", or "∞ (k of n seeds)".
func (e estimate) format(digits int) string {
	switch {
	case e.N == 0:
		return "n/a"
	case e.Infinite > 0:
		return fmt.Sprintf("∞ (%d of %d seeds)", e.Infinite, e.N)
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', digits, 64) }
	return fmt.Sprintf("%s [%s, %s]", f(e.Mean), f(e.Lo), f(e.Hi))
}

// formatRatio writes a ratio estimate as "0.82× [0.77, 0.88]".
func (e estimate) formatRatio(digits int) string {
	switch {
	case e.N == 0:
		return "n/a"
	case e.Infinite > 0:
		return fmt.Sprintf("∞ (%d of %d seeds)", e.Infinite, e.N)
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', digits, 64) }
	return fmt.Sprintf("%s× [%s, %s]", f(e.Mean), f(e.Lo), f(e.Hi))
}

// MarshalJSON writes the estimate with null for what is not finite.
func (e estimate) MarshalJSON() ([]byte, error) {
	num := func(x float64) any {
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return nil
		}
		return x
	}
	return json.Marshal(map[string]any{"mean": num(e.Mean), "lo": num(e.Lo), "hi": num(e.Hi), "n": e.N, "infinite": e.Infinite})
}
