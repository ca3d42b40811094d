// Package ci puts confidence intervals on the routing-quality benchmark's
// results when every case (workload × load × policy) runs over several
// seeds (10 or more).
//
// A seed fixes a case's arrivals, so a policy and the baseline run with
// the same seed see identical requests. PairedRatio therefore compares
// them seed by seed: it takes the ratios x_i/base_i, reports their median
// and a 95% percentile-bootstrap confidence interval of that median
// (resampling seeds with replacement). Median does the same for a single
// metric, such as goodput in requests per second. Both are deterministic:
// the bootstrap draws from a math/rand/v2 PCG seeded by the caller, so the
// same inputs give the same Interval.
//
// RatioVerdict and Interval.Compare read an interval as "better", "worse"
// or "no difference"; FormatRatio and FormatValue print it for reports.
package ci
