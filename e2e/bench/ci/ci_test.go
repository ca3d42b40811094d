package ci

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// around returns n baseline values and n policy values whose per-seed
// ratios are want × (1 + u), u uniform in [-noise, noise], drawn from a
// PCG seeded with seed.
func around(n int, want, noise float64, seed uint64) (x, base []float64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	for range n {
		b := 100 + 900*rng.Float64()
		base = append(base, b)
		x = append(x, b*want*(1+noise*(2*rng.Float64()-1)))
	}
	return x, base
}

func TestPairedRatioDeterministic(t *testing.T) {
	for _, tc := range []struct {
		name       string
		n          int
		want, span float64
	}{
		{"10 seeds", 10, 0.8, 0.3},
		{"25 seeds", 25, 1.2, 0.5},
		{"even, noisy", 16, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, base := around(tc.n, tc.want, tc.span, 7)
			a, err := PairedRatio(x, base, 2000, 42)
			if err != nil {
				t.Fatal(err)
			}
			b, err := PairedRatio(slices.Clone(x), slices.Clone(base), 2000, 42)
			if err != nil {
				t.Fatal(err)
			}
			if a != b {
				t.Errorf("same inputs and seed: %+v then %+v", a, b)
			}
			// The ends are percentiles of a few distinct resample medians,
			// so two seeds may agree; ten seeds all agreeing means the
			// seed is not used.
			differs := false
			for seed := uint64(43); seed < 53; seed++ {
				c, err := PairedRatio(x, base, 2000, seed)
				if err != nil {
					t.Fatal(err)
				}
				if c.Median != a.Median {
					t.Errorf("seed %d: median %v, seed 42: %v; the median depends on the bootstrap seed", seed, c.Median, a.Median)
				}
				differs = differs || c.Lo != a.Lo || c.Hi != a.Hi
			}
			if !differs {
				t.Errorf("seeds 42 to 52 all gave [%v, %v]: the seed is not used", a.Lo, a.Hi)
			}
			if a.N != tc.n {
				t.Errorf("N = %d, want %d", a.N, tc.n)
			}
		})
	}
}

func TestMedianDeterministic(t *testing.T) {
	xs, _ := around(12, 500, 0.2, 3)
	a, err := Median(xs, 1000, 9)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Median(xs, 1000, 9)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Errorf("same inputs and seed: %+v then %+v", a, b)
	}
}

func TestPairedRatioVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name         string
		n            int
		want, noise  float64
		maxWidth     float64 // Hi - Lo at most
		lowerBetter  string  // verdict when lower is better
		higherBetter string  // verdict when higher is better
	}{
		{"20% lower, 2% noise", 20, 0.8, 0.02, 0.03, Better, Worse},
		{"30% higher, 2% noise", 20, 1.3, 0.02, 0.05, Worse, Better},
		{"5% lower, 1% noise", 30, 0.95, 0.01, 0.01, Better, Worse},
		{"equal, 30% noise", 20, 1, 0.3, 0.5, NoDifference, NoDifference},
		{"equal, 60% noise, 10 seeds", 10, 1, 0.6, 1.2, NoDifference, NoDifference},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, base := around(tc.n, tc.want, tc.noise, 11)
			iv, err := PairedRatio(x, base, DefaultResamples, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !iv.Contains(tc.want) {
				t.Errorf("%s does not contain the true median %v", FormatRatio(iv, 4), tc.want)
			}
			if !(iv.Lo <= iv.Median && iv.Median <= iv.Hi) {
				t.Errorf("%s does not contain its own median", FormatRatio(iv, 4))
			}
			if w := iv.Hi - iv.Lo; w > tc.maxWidth {
				t.Errorf("%s is %.4f wide, want at most %v", FormatRatio(iv, 4), w, tc.maxWidth)
			}
			if got := RatioVerdict(iv, true); got != tc.lowerBetter {
				t.Errorf("lower is better: %s is %q, want %q", FormatRatio(iv, 4), got, tc.lowerBetter)
			}
			if got := RatioVerdict(iv, false); got != tc.higherBetter {
				t.Errorf("higher is better: %s is %q, want %q", FormatRatio(iv, 4), got, tc.higherBetter)
			}
		})
	}
}

// TestCoverage checks that the interval contains the true median in
// roughly 95% of experiments (the percentile bootstrap of a median from 15
// values is somewhat conservative or liberal by a few points, so the band
// is wide but still rejects, say, a 50% or a 100% interval).
func TestCoverage(t *testing.T) {
	const experiments = 300
	for _, tc := range []struct {
		name   string
		n      int
		median float64
		noise  float64
	}{
		{"15 seeds around 0.8", 15, 0.8, 0.1},
		{"20 seeds around 1.1", 20, 1.1, 0.3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits := 0
			var width float64
			for e := range experiments {
				x, base := around(tc.n, tc.median, tc.noise, uint64(1000+e))
				iv, err := PairedRatio(x, base, 1000, uint64(e))
				if err != nil {
					t.Fatal(err)
				}
				if iv.Contains(tc.median) {
					hits++
				}
				width += iv.Hi - iv.Lo
			}
			if rate := float64(hits) / experiments; rate < 0.88 || rate > 0.995 {
				t.Errorf("coverage %.3f, want about 0.95 (between 0.88 and 0.995)", rate)
			}
			if mean := width / experiments; mean > tc.median*tc.noise {
				t.Errorf("mean width %.4f, want below %.4f", mean, tc.median*tc.noise)
			}
		})
	}
}

func TestExactIntervals(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  func() (Interval, error)
		want Interval
	}{
		{"constant ratio", func() (Interval, error) {
			return PairedRatio([]float64{2, 4, 6, 8}, []float64{1, 2, 3, 4}, 500, 1)
		}, Interval{Median: 2, Lo: 2, Hi: 2, N: 4}},
		{"one seed", func() (Interval, error) {
			return PairedRatio([]float64{3}, []float64{4}, 500, 1)
		}, Interval{Median: 0.75, Lo: 0.75, Hi: 0.75, N: 1}},
		{"zero policy values", func() (Interval, error) {
			return PairedRatio([]float64{0, 0}, []float64{5, 7}, 500, 1)
		}, Interval{Median: 0, Lo: 0, Hi: 0, N: 2}},
		{"constant values", func() (Interval, error) {
			return Median([]float64{412.5, 412.5, 412.5}, 500, 1)
		}, Interval{Median: 412.5, Lo: 412.5, Hi: 412.5, N: 3}},
		{"negative values", func() (Interval, error) {
			return Median([]float64{-3, -3}, 500, 1)
		}, Interval{Median: -3, Lo: -3, Hi: -3, N: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.got()
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestMedianOfSample(t *testing.T) {
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"odd, unsorted", []float64{5, 1, 4, 2, 3}, 3},
		{"even, unsorted", []float64{10, 1, 7, 2}, 4.5},
		{"with an outlier", []float64{1, 2, 3, 4, 1e9}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.xs)
			iv, err := Median(in, 500, 5)
			if err != nil {
				t.Fatal(err)
			}
			if iv.Median != tc.want {
				t.Errorf("median %v, want %v", iv.Median, tc.want)
			}
			if lo, hi := slices.Min(tc.xs), slices.Max(tc.xs); iv.Lo < lo || iv.Hi > hi || iv.Lo > iv.Hi {
				t.Errorf("interval [%v, %v] is not inside the data's range [%v, %v]", iv.Lo, iv.Hi, lo, hi)
			}
			if !slices.Equal(in, tc.xs) {
				t.Errorf("Median reordered its input: %v, was %v", in, tc.xs)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"lengths differ", func() error { _, err := PairedRatio([]float64{1, 2}, []float64{1}, 500, 1); return err }, "2 values but 1 baseline"},
		{"no pairs", func() error { _, err := PairedRatio(nil, nil, 500, 1); return err }, "no values"},
		{"zero baseline", func() error { _, err := PairedRatio([]float64{1, 2}, []float64{1, 0}, 500, 1); return err }, "seed index 1: baseline value 0 is not positive"},
		{"negative baseline", func() error { _, err := PairedRatio([]float64{1}, []float64{-1}, 500, 1); return err }, "not positive"},
		{"negative value", func() error { _, err := PairedRatio([]float64{-1}, []float64{1}, 500, 1); return err }, "value -1 is negative"},
		{"NaN value", func() error { _, err := PairedRatio([]float64{nan}, []float64{1}, 500, 1); return err }, "not finite"},
		{"infinite baseline", func() error { _, err := PairedRatio([]float64{1}, []float64{inf}, 500, 1); return err }, "baseline: value +Inf is not finite"},
		{"too few resamples", func() error { _, err := PairedRatio([]float64{1}, []float64{1}, 99, 1); return err }, "99 bootstrap resamples"},
		{"median of nothing", func() error { _, err := Median(nil, 500, 1); return err }, "median: no values"},
		{"median of NaN", func() error { _, err := Median([]float64{1, nan}, 500, 1); return err }, "seed index 1: value NaN"},
		{"median, too few resamples", func() error { _, err := Median([]float64{1}, 0, 1); return err }, "at least 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if err == nil {
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestCompare(t *testing.T) {
	iv := Interval{Median: 0.9, Lo: 0.8, Hi: 0.95, N: 10}
	for _, tc := range []struct {
		name          string
		iv            Interval
		ref           float64
		lowerIsBetter bool
		want          string
	}{
		{"below ref, lower better", iv, 1, true, Better},
		{"below ref, higher better", iv, 1, false, Worse},
		{"above ref, lower better", iv, 0.5, true, Worse},
		{"above ref, higher better", iv, 0.5, false, Better},
		{"contains ref", iv, 0.9, true, NoDifference},
		{"ref at Lo", iv, 0.8, false, NoDifference},
		{"ref at Hi", iv, 0.95, true, NoDifference},
		{"empty", Interval{}, 1, true, NoData},
		{"empty containing ref by value", Interval{Lo: 0, Hi: 2}, 1, true, NoData},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.iv.Compare(tc.ref, tc.lowerIsBetter); got != tc.want {
				t.Errorf("%+v against %v: %q, want %q", tc.iv, tc.ref, got, tc.want)
			}
			if tc.ref == 1 {
				if got := RatioVerdict(tc.iv, tc.lowerIsBetter); got != tc.want {
					t.Errorf("RatioVerdict(%+v): %q, want %q", tc.iv, got, tc.want)
				}
			}
		})
	}
}

func TestFormat(t *testing.T) {
	iv := Interval{Median: 0.8234, Lo: 0.7651, Hi: 0.88, N: 10}
	for _, tc := range []struct {
		name string
		got  string
		want string
	}{
		{"ratio, 2 digits", FormatRatio(iv, 2), "0.82× [0.77, 0.88]"},
		{"ratio, 3 digits", FormatRatio(iv, 3), "0.823× [0.765, 0.880]"},
		{"ratio, shortest", FormatRatio(iv, -1), "0.8234× [0.7651, 0.88]"},
		{"value, 1 digit", FormatValue(Interval{Median: 412.34, Lo: 398.05, Hi: 425, N: 12}, 1), "412.3 [398.1, 425.0]"},
		{"value, 0 digits", FormatValue(Interval{Median: 412.34, Lo: 398.05, Hi: 425, N: 12}, 0), "412 [398, 425]"},
		{"empty ratio", FormatRatio(Interval{}, 2), "n/a"},
		{"empty value", FormatValue(Interval{}, 2), "n/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}
