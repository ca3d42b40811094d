package main

import (
	"strings"
	"testing"
)

func TestFormatting(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{span([]float64{1.234, 1.5, 1.3}, msf), "1.23–1.50"},
		{span([]float64{2.001, 2.004}, msf), "2.00"},
		{span(nil, msf), "—"},
		{msf(12.34), "12.3"},
		{msf(1234.5), "1234"},
		{signedMs(-0.5), "−0.50"},
		{signedMs(3), "+3.00"},
		{rps(1234567.4), "1,234,567"},
		{rps(999), "999"},
		{ratioX(0.456), "0.46×"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestWriteReport(t *testing.T) {
	open := loadCase{bodyBytes: 32 << 10, rate: 200}
	closed := loadCase{bodyBytes: 1 << 10, workers: 20}
	var results []result
	for rep := 1; rep <= 2; rep++ {
		f := float64(rep)
		results = append(results,
			result{Variant: variantDirect, Case: open, Rep: rep, Stats: stats{P50: f, P99: 2 * f, Rate: 200, Throughput: 200, ServerCPU: 0.2 * f, LoadCPU: -1,
				CPUPerReq: map[string]float64{roleProxy: 100 * f, roleEngines: 50}}},
			result{Variant: variantAgg, Case: open, Rep: rep, Stats: stats{P50: f + 3, P99: 2*f + 5, Rate: 199, Throughput: 198, ServerCPU: 0.5, LoadCPU: 0.1, Errors: 1, Codes: "503×1", ErrP50: 0.4 * f,
				CPUPerReq: map[string]float64{roleProxy: 300, roleProcessor: 200 + f, roleEngines: 50}}},
			result{Variant: variantDirect, Case: closed, Rep: rep, Stats: stats{Throughput: 1000 * f, ServerCPU: 1, LoadCPU: 0.3}},
			result{Variant: variantAgg, Case: closed, Rep: rep, Stats: stats{Throughput: 400 * f, ServerCPU: 1, LoadCPU: -1}},
		)
	}
	var b strings.Builder
	if err := writeReport(&b, meta{Command: "make bench-overhead"}, []string{variantDirect, variantAgg}, []loadCase{open, closed}, results); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"## 32 KiB, 200 rps",
		"| direct | 1.00–2.00 | 0.00 | 2.00–4.00 | 0.00 | — | — | 200 | 200 | 20–40 % | 0 |",
		"| duet aggregated | 4.00–5.00 | 0.00 | 7.00–9.00 | 0.00 | +3.00 | +5.00 | 199 | 198 | 50 % | 1, in 0.40–0.80 ms p50 |",
		"| direct | 1,000–2,000 | — | 0.00 | 0.00 | 0.00 | 100 % | 30 % | 0 |",
		"| duet aggregated | 400–800 | 0.40× | 0.00 | 0.00 | 0.00 | 100 % | — | 0 |",
		"### 32 KiB, 200 rps\n\n| variant | proxy | processor | engines | total | added |",
		"| direct | 100–200 | — | 50 | 150–250 | — |",
		// Totals 551 and 552 against direct's 150 and 250.
		"| duet aggregated | 300 | 201–202 | 50 | 551–552 | +302–+401 |",
		"| 32 KiB, 200 rps | duet aggregated | 2 | 5.00 | 0.00 | 9.00 | 0.00 | 199 | 198 | 50 % | 10 % | 1 (503×1, p50 0.80 ms) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	// The closed-loop case has no CPU per request: no table for it.
	if strings.Contains(out, "### 1 KiB, concurrency 20") {
		t.Errorf("a CPU table for a case without CPU figures:\n%s", out)
	}
}
