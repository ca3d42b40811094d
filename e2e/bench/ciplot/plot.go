package ciplot

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/duet-router/duet/e2e/bench/ci"
)

// Width and Height are the size of the PNG images, in pixels.
const (
	Width  = 900
	Height = 500
)

// dpi is the images' resolution: it sets the size of text and glyphs
// relative to the image.
const dpi = 100

// groupWidth is the share of the distance between two groups that one
// group's series spread over.
const groupWidth = 0.7

// ReferenceLabel is the legend entry of Ratios' reference line at 1.0.
const ReferenceLabel = "engine default"

// Series is one policy's intervals, Points[i] belonging to the i-th
// group. A point with N == 0 (no data) is not drawn.
type Series struct {
	Name   string
	Points []ci.Interval
}

// Ratios writes to path a PNG plot of ratio intervals (ci.PairedRatio),
// grouped along the x axis by groups, one point with an error bar per
// series in each group, and a dashed line at y = 1.0 labelled
// ReferenceLabel. Every series must have one point per group, and at
// least one point must have data.
func Ratios(path, title, ylabel string, groups []string, series []Series) error {
	if err := write(path, title, ylabel, groups, series, true); err != nil {
		return fmt.Errorf("ratio plot %s: %w", path, err)
	}
	return nil
}

// Values is Ratios without the reference line, for intervals of plain
// values (ci.Median) such as goodput in requests per second.
func Values(path, title, ylabel string, groups []string, series []Series) error {
	if err := write(path, title, ylabel, groups, series, false); err != nil {
		return fmt.Errorf("value plot %s: %w", path, err)
	}
	return nil
}

// write builds one plot and saves it.
func write(path, title, ylabel string, groups []string, series []Series, reference bool) error {
	p, err := build(title, ylabel, groups, series, reference)
	if err != nil {
		return err
	}
	return save(path, p)
}

// build lays out the plot: group g is centred at x = g, and each series
// is shifted from it by offset.
func build(title, ylabel string, groups []string, series []Series, reference bool) (*plot.Plot, error) {
	if len(groups) == 0 {
		return nil, errors.New("no groups")
	}
	if len(series) == 0 {
		return nil, errors.New("no series")
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Y.Tick.Marker = PlainTicks{}
	p.NominalX(groups...)
	p.Legend.Top = true
	grid := plotter.NewGrid()
	grid.Vertical.Color = nil
	p.Add(grid)

	drawn, entries := 0, 0
	ylo, yhi := math.Inf(1), math.Inf(-1)
	for s, ser := range series {
		if len(ser.Points) != len(groups) {
			return nil, fmt.Errorf("series %q has %d points for %d groups", ser.Name, len(ser.Points), len(groups))
		}
		dx := offset(s, len(series))
		var medians, bottoms plotter.XYs
		var spans plotter.YErrors
		for g, iv := range ser.Points {
			if iv.N == 0 {
				continue
			}
			x := float64(g) + dx
			medians = append(medians, plotter.XY{X: x, Y: iv.Median})
			// The bar is anchored at Lo so that it spans [Lo, Hi] even
			// if the median fell outside the interval.
			bottoms = append(bottoms, plotter.XY{X: x, Y: iv.Lo})
			spans = append(spans, struct{ Low, High float64 }{0, iv.Hi - iv.Lo})
			ylo, yhi = min(ylo, iv.Lo, iv.Median), max(yhi, iv.Hi, iv.Median)
		}
		if len(medians) == 0 {
			continue
		}
		drawn += len(medians)
		points, err := plotter.NewScatter(medians)
		if err != nil {
			return nil, fmt.Errorf("series %q: %w", ser.Name, err)
		}
		bars, err := plotter.NewYErrorBars(errorBars{bottoms, spans})
		if err != nil {
			return nil, fmt.Errorf("series %q: %w", ser.Name, err)
		}
		points.Color, points.Shape = plotutil.Color(s), shape(s)
		points.Radius = vg.Points(3.5)
		bars.Color, bars.Width = plotutil.Color(s), vg.Points(1.2)
		p.Add(bars, points)
		p.Legend.Add(ser.Name, points)
		entries++
	}
	if drawn == 0 {
		return nil, errors.New("no point has data")
	}
	if reference {
		ylo, yhi = min(ylo, 1), max(yhi, 1)
		// A line across all groups rather than a plotter.Function, so
		// that the y range always includes 1.
		line, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(groups)) - 0.5, Y: 1}})
		if err != nil {
			return nil, fmt.Errorf("reference line: %w", err)
		}
		line.Color = color.Gray{Y: 60}
		line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		p.Add(line)
		p.Legend.Add(ReferenceLabel, line)
		entries++
	}
	// Half a group's spacing of margin on either side, whatever the
	// series' offsets.
	p.X.Min, p.X.Max = -0.5, float64(len(groups))-0.5
	p.Y.Min, p.Y.Max = yRange(ylo, yhi, entries)
	return p, nil
}

// offset is the horizontal shift of series s of k from its group's
// centre: the k series are spaced evenly across groupWidth, centred.
func offset(s, k int) float64 {
	return (float64(s) - float64(k-1)/2) * groupWidth / float64(k)
}

// yRange pads the data's range [lo, hi] with 5% below and, above, with
// room for a legend of entries lines, so that the legend (top right) does
// not cover the data.
func yRange(lo, hi float64, entries int) (float64, float64) {
	span := hi - lo
	if span == 0 {
		span = math.Max(math.Abs(hi), 1) / 10
	}
	top := min(0.04*float64(entries)+0.04, 0.5) // share of the axis above the data
	return lo - 0.05*span, hi + span*(top+0.05)/(1-top)
}

// shape is series i's glyph: filled shapes first, then outlines.
func shape(i int) draw.GlyphDrawer {
	shapes := []draw.GlyphDrawer{
		draw.CircleGlyph{}, draw.BoxGlyph{}, draw.PyramidGlyph{},
		draw.RingGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{},
		draw.CrossGlyph{}, draw.PlusGlyph{},
	}
	return shapes[i%len(shapes)]
}

// errorBars feeds plotter.NewYErrorBars.
type errorBars struct {
	plotter.XYs
	plotter.YErrors
}

// save writes p as a Width × Height PNG.
func save(path string, p *plot.Plot) error {
	img := vgimg.NewWith(
		vgimg.UseWH(vg.Length(Width)/dpi*vg.Inch, vg.Length(Height)/dpi*vg.Inch),
		vgimg.UseDPI(dpi))
	p.Draw(draw.New(img))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write: %w", err)
	}
	return f.Close()
}

// PlainTicks are gonum's default ticks with short labels ("0.8", not
// "0.80").
type PlainTicks struct{}

// Ticks implements plot.Ticker.
func (PlainTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'g', 6, 64)
		}
	}
	return ticks
}
