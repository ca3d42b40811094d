package ci

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
)

// Verdicts returned by RatioVerdict and Interval.Compare.
const (
	// Better means the whole interval lies on the better side of the
	// reference.
	Better = "better"
	// Worse means the whole interval lies on the worse side of the
	// reference.
	Worse = "worse"
	// NoDifference means the interval contains the reference.
	NoDifference = "no difference"
	// NoData means the interval is empty (N == 0).
	NoData = "no data"
)

// MinResamples is the fewest bootstrap resamples PairedRatio and Median
// accept: fewer cannot place the 2.5th and 97.5th percentiles.
const MinResamples = 100

// DefaultResamples is a resample count for reports: with it, the ends of
// an interval from 10 to 50 seeds of noisy ratios (±30%) moved by under 1%
// between bootstrap seeds, at a few to 30 ms per interval.
const DefaultResamples = 10000

// The interval's ends are these percentiles of the bootstrap medians (a
// 95% interval).
const (
	loPercentile = 2.5
	hiPercentile = 97.5
)

// Interval is a median with its 95% bootstrap confidence interval [Lo,
// Hi], computed from N per-seed values. The zero Interval (N == 0) means
// no data.
type Interval struct {
	Median float64 `json:"median"`
	Lo     float64 `json:"lo"`
	Hi     float64 `json:"hi"`
	N      int     `json:"n"`
}

// Contains reports whether x lies in [Lo, Hi]. An empty interval (N == 0)
// contains nothing.
func (iv Interval) Contains(x float64) bool {
	return iv.N > 0 && iv.Lo <= x && x <= iv.Hi
}

// Compare reads the interval against a reference value: Better when the
// whole interval is on the better side of ref (below it when
// lowerIsBetter, above it otherwise), Worse when it is wholly on the other
// side, NoDifference when it contains ref, and NoData when N == 0.
func (iv Interval) Compare(ref float64, lowerIsBetter bool) string {
	switch {
	case iv.N == 0:
		return NoData
	case iv.Contains(ref):
		return NoDifference
	case (iv.Hi < ref) == lowerIsBetter:
		return Better
	default:
		return Worse
	}
}

// RatioVerdict reads an interval of ratios to the baseline (from
// PairedRatio): it compares the interval with 1.0, the baseline itself.
// With lowerIsBetter (latency, say) a ratio interval wholly below 1 is
// Better; without it (throughput) a ratio interval wholly above 1 is.
func RatioVerdict(iv Interval, lowerIsBetter bool) string {
	return iv.Compare(1, lowerIsBetter)
}

// PairedRatio compares a policy with the baseline seed by seed: x[i] and
// base[i] are one metric of the two runs with the same seed. It returns
// the median of the ratios x[i]/base[i] and a 95% percentile-bootstrap
// confidence interval of that median, from resamples resamples of the
// seeds (drawn with replacement, from a PCG seeded with seed).
//
// Every pair counts; none is skipped. It is an error for x and base to
// differ in length or be empty, for a value to be NaN or infinite, for
// base[i] to be zero or negative (a ratio to it means nothing) or for
// x[i] to be negative, and for resamples to be below MinResamples.
func PairedRatio(x, base []float64, resamples int, seed uint64) (Interval, error) {
	if len(x) != len(base) {
		return Interval{}, fmt.Errorf("paired ratio: %d values but %d baseline values", len(x), len(base))
	}
	if len(x) == 0 {
		return Interval{}, fmt.Errorf("paired ratio: no values")
	}
	ratios := make([]float64, len(x))
	for i := range x {
		if err := checkFinite(x[i]); err != nil {
			return Interval{}, fmt.Errorf("paired ratio: seed index %d: %w", i, err)
		}
		if err := checkFinite(base[i]); err != nil {
			return Interval{}, fmt.Errorf("paired ratio: seed index %d: baseline: %w", i, err)
		}
		if base[i] <= 0 {
			return Interval{}, fmt.Errorf("paired ratio: seed index %d: baseline value %g is not positive", i, base[i])
		}
		if x[i] < 0 {
			return Interval{}, fmt.Errorf("paired ratio: seed index %d: value %g is negative", i, x[i])
		}
		ratios[i] = x[i] / base[i]
	}
	iv, err := bootstrap(ratios, resamples, seed)
	if err != nil {
		return Interval{}, fmt.Errorf("paired ratio: %w", err)
	}
	return iv, nil
}

// Median returns the median of one metric's per-seed values xs and a 95%
// percentile-bootstrap confidence interval of it, exactly as PairedRatio
// does for ratios. It is an error for xs to be empty or hold NaN or an
// infinity, and for resamples to be below MinResamples.
func Median(xs []float64, resamples int, seed uint64) (Interval, error) {
	if len(xs) == 0 {
		return Interval{}, fmt.Errorf("median: no values")
	}
	for i, x := range xs {
		if err := checkFinite(x); err != nil {
			return Interval{}, fmt.Errorf("median: seed index %d: %w", i, err)
		}
	}
	iv, err := bootstrap(xs, resamples, seed)
	if err != nil {
		return Interval{}, fmt.Errorf("median: %w", err)
	}
	return iv, nil
}

// FormatRatio writes a ratio interval as "0.82× [0.77, 0.88]", with digits
// digits after the decimal point (-1: as few as represent each value
// exactly). An empty interval is "n/a".
func FormatRatio(iv Interval, digits int) string {
	if iv.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%s× [%s, %s]", ftoa(iv.Median, digits), ftoa(iv.Lo, digits), ftoa(iv.Hi, digits))
}

// FormatValue writes a value interval as "412.3 [398.1, 425.0]", with
// digits as in FormatRatio. An empty interval is "n/a".
func FormatValue(iv Interval, digits int) string {
	if iv.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%s [%s, %s]", ftoa(iv.Median, digits), ftoa(iv.Lo, digits), ftoa(iv.Hi, digits))
}

// bootstrap returns the median of xs and the 2.5th and 97.5th percentiles
// of the medians of resamples resamples of xs drawn with replacement by a
// PCG seeded with (seed, 0). xs is not modified.
func bootstrap(xs []float64, resamples int, seed uint64) (Interval, error) {
	if resamples < MinResamples {
		return Interval{}, fmt.Errorf("%d bootstrap resamples, want at least %d", resamples, MinResamples)
	}
	n := len(xs)
	rng := rand.New(rand.NewPCG(seed, 0))
	sample := make([]float64, n)
	medians := make([]float64, resamples)
	for b := range medians {
		for i := range sample {
			sample[i] = xs[rng.IntN(n)]
		}
		slices.Sort(sample)
		medians[b] = percentile(sample, 50)
	}
	slices.Sort(medians)
	sorted := slices.Sorted(slices.Values(xs))
	return Interval{
		Median: percentile(sorted, 50),
		Lo:     percentile(medians, loPercentile),
		Hi:     percentile(medians, hiPercentile),
		N:      n,
	}, nil
}

// percentile returns the p-th percentile of sorted (non-empty) values,
// interpolating linearly between closest ranks; the 50th is the usual
// median (the mean of the middle two for an even count).
func percentile(sorted []float64, p float64) float64 {
	pos := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// checkFinite rejects NaN and infinities.
func checkFinite(x float64) error {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Errorf("value %g is not finite", x)
	}
	return nil
}

// ftoa formats x with digits digits after the decimal point.
func ftoa(x float64, digits int) string {
	return strconv.FormatFloat(x, 'f', digits, 64)
}
