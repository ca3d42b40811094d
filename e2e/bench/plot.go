package bench

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/duet-router/duet/e2e/bench/ciplot"
)

// TTFTPlotFile and RankLoadPlotFile are the plots' file names.
func TTFTPlotFile(workload string) string { return "ttft-vs-load-" + fileSafe(workload) + ".png" }

// RankLoadPlotFile is the per-rank load plot of one policy.
// A policy named PREFILL/DECODE (or with a YAML mapping) is written with
// every character outside [A-Za-z0-9._-] replaced by "_".
func RankLoadPlotFile(policy string) string { return "rank-load-" + fileSafe(policy) + ".png" }

// fileSafe replaces what a file name should not hold with "_".
func fileSafe(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, name)
}

// PlotTTFTvsLoad draws mean and p99 TTFT against offered load (requests
// per model second), one line per policy, for one workload.
func PlotTTFTvsLoad(path, workload string, summaries []Summary, policies []string) error {
	var panels []*plot.Plot
	for _, stat := range []struct {
		name string
		get  func(Dist) float64
	}{{"mean", func(d Dist) float64 { return d.Mean }}, {"p99", func(d Dist) float64 { return d.P99 }}} {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: TTFT %s vs load", workload, stat.name)
		p.X.Label.Text = "offered load (requests/s, model time)"
		p.Y.Label.Text = "TTFT " + stat.name + " (ms)"
		p.Legend.Top, p.Legend.Left = true, true
		plotted := false
		for i, pol := range policies {
			var pts plotter.XYs
			for _, s := range summaries {
				if s.Workload == workload && s.Policy == pol && s.Failed == "" && stat.get(s.TTFTms) > 0 {
					pts = append(pts, plotter.XY{X: s.RequestRate, Y: stat.get(s.TTFTms)})
				}
			}
			if len(pts) == 0 {
				continue
			}
			slices.SortFunc(pts, func(a, b plotter.XY) int { return cmpFloat(a.X, b.X) })
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
			line.Dashes = plotutil.Dashes(i)
			points.Shape = plotutil.Shape(i)
			p.Add(line, points)
			p.Legend.Add(pol, line, points)
			plotted = true
		}
		if plotted {
			// A log scale needs positive values: an empty panel (every
			// run failed) keeps the linear default rather than panicking.
			p.Y.Label.Text += ", log scale"
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = logTicks{}
		}
		p.Add(plotter.NewGrid())
		panels = append(panels, p)
	}
	return savePanels(path, [][]*plot.Plot{panels}, 24*vg.Centimeter, 10*vg.Centimeter)
}

// PlotRankLoad draws every rank's tokens over model time, prefill ranks
// above decode ranks, for one run.
func PlotRankLoad(path, title string, polls []Poll, labels map[string][]string, w Window) error {
	var rows [][]*plot.Plot
	for _, role := range []string{RolePrefill, RoleDecode} {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: %s ranks (imbalance %.2f)", title, role, Imbalance(polls, role, w.From, w.To))
		p.X.Label.Text = "model time (s)"
		p.Y.Label.Text = "tokens on rank (num_total_tokens)"
		p.Y.Tick.Marker = ciplot.PlainTicks{}
		p.X.Tick.Marker = ciplot.PlainTicks{}
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.TextStyle.Font.Size = vg.Points(8)
		for i, label := range labels[role] {
			var pts plotter.XYs
			for _, poll := range polls {
				if v := poll.Tokens[role]; i < len(v) {
					pts = append(pts, plotter.XY{X: poll.At.Seconds(), Y: v[i]})
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			line.Color = plotutil.Color(i)
			line.Dashes = plotutil.Dashes(i / 7)
			line.Width = vg.Points(1)
			p.Add(line)
			p.Legend.Add(label, line)
		}
		p.Add(plotter.NewGrid())
		rows = append(rows, []*plot.Plot{p})
	}
	return savePanels(path, rows, 24*vg.Centimeter, 16*vg.Centimeter)
}

// savePanels lays out plots in a grid and writes a PNG.
func savePanels(path string, plots [][]*plot.Plot, width, height vg.Length) error {
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110))
	dc := draw.New(img)
	t := draw.Tiles{
		Rows: len(plots), Cols: len(plots[0]),
		PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2,
	}
	canvases := plot.Align(plots, t, dc)
	for j := range plots {
		for i := range plots[j] {
			if plots[j][i] != nil {
				plots[j][i].Draw(canvases[j][i])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// logTicks labels a log axis at 1, 2 and 5 times the powers of ten, so
// that a range narrower than a decade still has labels.
type logTicks struct{}

// Ticks implements plot.Ticker.
func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return ciplot.PlainTicks{}.Ticks(lo, hi)
	}
	var out []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	if len(out) < 2 {
		return ciplot.PlainTicks{}.Ticks(lo, hi)
	}
	return out
}

// cmpFloat orders floats.
func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
