package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/bench"
)

// TestParseVariant reads variant names into their settings.
func TestParseVariant(t *testing.T) {
	for _, tt := range []struct {
		name     string
		on       bool
		prefill  int64
		kv       float64
		waiting  int
		wait     time.Duration
		replicas int
		drop     string
		share    float64
		prio     bool
	}{
		{name: "off"},
		{name: "on", on: true, wait: admissionWaitLimit},
		{name: "on/p=4096/kv=0.8/w=off/wait=2s", on: true, prefill: 4096, kv: 0.8, waiting: -1, wait: 2 * time.Second},
		{name: "on+r3", on: true, wait: admissionWaitLimit, replicas: 3},
		{name: "alone-noisy+r3", replicas: 3, drop: "noisy"},
		{name: "on/prio/share=0.5", on: true, wait: admissionWaitLimit, share: 0.5, prio: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v, err := parseVariant(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if (v.adm != nil) != tt.on || v.replicas != tt.replicas || v.drop != tt.drop {
				t.Fatalf("%+v", v)
			}
			if v.adm == nil {
				return
			}
			s := v.adm.Saturation
			batch := v.adm.Queue.Classes[1]
			if s.PrefillTokens != tt.prefill || s.KVFraction != tt.kv || s.Waiting != tt.waiting || v.adm.Queue.Classes[0].WaitLimit != tt.wait ||
				batch.Share != tt.share || v.adm.EnginePriority != tt.prio {
				t.Fatalf("saturation %+v, classes %+v", s, v.adm.Queue.Classes)
			}
		})
	}
	for _, bad := range []string{"maybe", "on/p=x", "on/q=1", "off/p=1", "on+r0", "on/share=2"} {
		if _, err := parseVariant(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// TestAdmissionWorkloads: the mixes have their proportions, bursts thin
// the arrivals outside the bursts, and a baseline keeps the same requests
// less a class or tenant.
func TestAdmissionWorkloads(t *testing.T) {
	const rate, window = 10.0, 10 * time.Minute
	w, err := classesMix(rate, window, 1)
	if err != nil {
		t.Fatal(err)
	}
	count := func(w bench.Workload, f func(bench.Session) bool) int {
		n := 0
		for _, s := range w.Sessions {
			if f(s) {
				n++
			}
		}
		return n
	}
	inter := count(w, func(s bench.Session) bool { return s.Class == classInteractive })
	if share := float64(inter) / float64(len(w.Sessions)); math.Abs(share-interactiveShare) > 0.03 {
		t.Errorf("interactive share %.3f, want about %.2f", share, interactiveShare)
	}
	alone := without(w, classBatch)
	if len(alone.Sessions) != inter || alone.Sessions[0].Turns[0].User != w.Sessions[slicesIndex(w, classInteractive)].Turns[0].User {
		t.Error("the interactive class alone is not the same requests")
	}
	tw, err := tenantsMix(rate, window, 1)
	if err != nil {
		t.Fatal(err)
	}
	noisy := count(tw, func(s bench.Session) bool { return s.Tenant == noisyTenant })
	other := count(tw, func(s bench.Session) bool { return s.Tenant == "tenant-1" })
	if r := float64(noisy) / float64(other); r < 8 || r > 12 {
		t.Errorf("noisy tenant sends %.1f× tenant-1's requests, want about %d×", r, noisyFactor)
	}
	b, err := shaped(classesMix, rate, burst2x, window, 1)
	if err != nil {
		t.Fatal(err)
	}
	in := count(b, func(s bench.Session) bool { return burst2x.at(s.Start) == burst2x.High })
	perSecond := func(n int, share float64) float64 { return float64(n) / (window.Seconds() * share) }
	high, low := perSecond(in, 0.25), perSecond(len(b.Sessions)-in, 0.75)
	if math.Abs(high/rate-burst2x.High) > 0.2 || math.Abs(low/rate-burst2x.Low) > 0.1 {
		t.Errorf("burst rates %.1f and %.1f requests/s, want about %g and %g", high, low, rate*burst2x.High, rate*burst2x.Low)
	}
}

// slicesIndex is the index of w's first session of class.
func slicesIndex(w bench.Workload, class string) int {
	for i, s := range w.Sessions {
		if s.Class == class {
			return i
		}
	}
	return -1
}

// TestEstimates checks the mean interval and the paired ratios.
func TestEstimates(t *testing.T) {
	e := meanOf([]float64{1, 2, 3, 4, 5})
	if e.Mean != 3 || math.Abs(e.Hi-3-2.776*math.Sqrt(2.5/5)) > 1e-9 || e.Lo >= e.Mean {
		t.Errorf("meanOf = %+v", e)
	}
	if r := ratioOf([]float64{2, 0, math.Inf(1)}, []float64{1, 0, math.Inf(1)}); r.Infinite != 0 || math.Abs(r.Mean-4.0/3) > 1e-9 {
		t.Errorf("ratioOf = %+v", r)
	}
	if r := ratioOf([]float64{1}, []float64{0}); r.Infinite != 1 || r.format(0) != "∞ (1 of 1 seeds)" {
		t.Errorf("ratio over zero = %+v", r)
	}
	if got := atLeast(meanOf([]float64{0.95, 0.96, 0.97}), 0.9); got != aimMet {
		t.Errorf("atLeast = %s", got)
	}
	if got := atMost(meanOf([]float64{1.2, 1.6, 2}), 1.5); got != aimInconclusive {
		t.Errorf("atMost = %s", got)
	}
}

// TestAdmissionReport runs a small admission comparison twice: the
// reports are byte-identical and hold every section.
func TestAdmissionReport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulator for about 30 seconds of CPU")
	}
	dir := runTwiceIdentical(t, []string{"-admission", "-admission-sweep=false", "-seeds", "2", "-window", "90s", "-warmup", "20s", "-resamples", "200",
		"-scenarios", "overload_2x,steady,matrix_preloaded", "-admission-variants", "on/p=4096"}, admissionReportFile, admissionDataFile)
	md, _ := os.ReadFile(filepath.Join(dir, admissionReportFile))
	for _, want := range []string{"## The pools' goodput rates", "## Aims of issue 27", aimHighClass, aimGoodput, aimNoHarm,
		"(`overload_2x`)", "| on/p=4096 | interactive |", "alone-batch", "matrix_preloaded"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
