// Package ciplot draws the routing-quality benchmark's confidence
// intervals (package ci) as PNG plots: one x-axis category per group (a
// workload or scenario), and within it one point per series (a policy)
// at the median with a vertical error bar from Lo to Hi. Series are set
// side by side within a group so that their bars do not overlap.
//
// Ratios adds a dashed reference line at 1.0, the baseline ("engine
// default"), for intervals from ci.PairedRatio; Values draws intervals of
// plain values (from ci.Median, e.g. goodput in requests per second).
package ciplot
