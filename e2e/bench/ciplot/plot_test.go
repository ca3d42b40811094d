package ciplot

import (
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/duet-router/duet/e2e/bench/ci"
)

// readPNG decodes the PNG at path.
func readPNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	return img
}

// colours counts an image's distinct colours.
func colours(img image.Image) int {
	seen := map[[4]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, bl, a}] = true
		}
	}
	return len(seen)
}

// iv is an interval from 10 seeds.
func iv(median, lo, hi float64) ci.Interval {
	return ci.Interval{Median: median, Lo: lo, Hi: hi, N: 10}
}

func TestPlots(t *testing.T) {
	groups := []string{"variable", "multiturn", "bursty"}
	ratios := []Series{
		{"least-load", []ci.Interval{iv(0.82, 0.77, 0.88), iv(0.95, 0.9, 1.02), iv(0.7, 0.6, 0.8)}},
		{"prefix", []ci.Interval{iv(0.9, 0.85, 0.97), {}, iv(1.1, 1.0, 1.2)}},
		{"random", []ci.Interval{iv(1.2, 1.1, 1.3), iv(1.05, 0.98, 1.1), iv(1.4, 1.3, 1.5)}},
	}
	values := []Series{
		{"engine default", []ci.Interval{iv(410, 398, 425), iv(380, 370, 390), iv(300, 280, 320)}},
		{"least-load", []ci.Interval{iv(450, 440, 460), iv(385, 372, 399), iv(350, 330, 360)}},
	}
	for _, tc := range []struct {
		name   string
		draw   func(path, title, ylabel string, groups []string, series []Series) error
		groups []string
		series []Series
	}{
		{"ratios", Ratios, groups, ratios},
		{"values", Values, groups, values},
		{"one group, one constant point", Values, []string{"only"}, []Series{{"p", []ci.Interval{iv(5, 5, 5)}}}},
		{"ratios far from 1", Ratios, []string{"a"}, []Series{{"p", []ci.Interval{iv(40, 35, 45)}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "plot.png")
			if err := tc.draw(path, "TTFT p99 vs engine default", "ratio", tc.groups, tc.series); err != nil {
				t.Fatal(err)
			}
			img := readPNG(t, path)
			if b := img.Bounds(); b.Dx() != Width || b.Dy() != Height {
				t.Errorf("image is %d×%d, want %d×%d", b.Dx(), b.Dy(), Width, Height)
			}
			// Text, axes and at least one coloured series: a blank or
			// single-colour image has one or two colours.
			if n := colours(img); n < 10 {
				t.Errorf("image has %d colours; it looks blank", n)
			}
		})
	}
}

// TestReferenceLine checks that Ratios draws something Values does not:
// the same data differs only by the reference line and its legend entry.
func TestReferenceLine(t *testing.T) {
	groups := []string{"a", "b"}
	series := []Series{{"p", []ci.Interval{iv(0.5, 0.4, 0.6), iv(1.5, 1.4, 1.6)}}}
	dir := t.TempDir()
	r, v := filepath.Join(dir, "r.png"), filepath.Join(dir, "v.png")
	if err := Ratios(r, "t", "y", groups, series); err != nil {
		t.Fatal(err)
	}
	if err := Values(v, "t", "y", groups, series); err != nil {
		t.Fatal(err)
	}
	ri, vi := readPNG(t, r), readPNG(t, v)
	differ := 0
	b := ri.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if ri.At(x, y) != vi.At(x, y) {
				differ++
			}
		}
	}
	if differ < 100 {
		t.Errorf("ratio and value plots differ in %d pixels; want the reference line", differ)
	}
}

func TestPlotErrors(t *testing.T) {
	ok := []ci.Interval{iv(1, 0.9, 1.1), iv(1, 0.9, 1.1)}
	for _, tc := range []struct {
		name   string
		path   string
		groups []string
		series []Series
		want   string
	}{
		{"too few points", "p.png", []string{"a", "b"}, []Series{{"x", ok}, {"short", ok[:1]}}, `series "short" has 1 points for 2 groups`},
		{"too many points", "p.png", []string{"a"}, []Series{{"long", ok}}, `series "long" has 2 points for 1 groups`},
		{"no groups", "p.png", nil, []Series{{"x", nil}}, "no groups"},
		{"no series", "p.png", []string{"a"}, nil, "no series"},
		{"no data", "p.png", []string{"a", "b"}, []Series{{"x", make([]ci.Interval, 2)}}, "no point has data"},
		{"unwritable path", "missing/dir/p.png", []string{"a", "b"}, []Series{{"x", ok}}, "missing/dir/p.png"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, draw := range map[string]func(string, string, string, []string, []Series) error{"Ratios": Ratios, "Values": Values} {
				path := filepath.Join(dir, tc.path)
				err := draw(path, "t", "y", tc.groups, tc.series)
				if err == nil {
					t.Fatalf("%s: no error, want one containing %q", name, tc.want)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: error %q, want it to contain %q", name, err, tc.want)
				}
				if _, err := os.Stat(path); err == nil && tc.name != "unwritable path" {
					t.Errorf("%s: wrote %s despite the error", name, path)
				}
			}
		})
	}
}

func TestOffset(t *testing.T) {
	for _, k := range []int{1, 2, 3, 5, 8} {
		t.Run(strconv.Itoa(k), func(t *testing.T) {
			var xs []float64
			for s := range k {
				xs = append(xs, offset(s, k))
			}
			for s, x := range xs {
				if math.Abs(x) > groupWidth/2 {
					t.Errorf("series %d of %d: offset %v leaves the group (±%v)", s, k, x, groupWidth/2)
				}
				if mirror := xs[k-1-s]; math.Abs(x+mirror) > 1e-12 {
					t.Errorf("series %d of %d: offset %v, its mirror %v; not centred", s, k, x, mirror)
				}
				if s > 0 && x-xs[s-1] < groupWidth/float64(k)-1e-12 {
					t.Errorf("series %d and %d of %d are %v apart, want %v", s-1, s, k, x-xs[s-1], groupWidth/float64(k))
				}
			}
		})
	}
}

func TestYRange(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lo, hi  float64
		entries int
	}{
		{"ratios", 0.6, 1.5, 4},
		{"values", 280, 460, 2},
		{"one value", 5, 5, 1},
		{"zero", 0, 0, 1},
		{"many entries", 0, 1, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := yRange(tc.lo, tc.hi, tc.entries)
			if !(lo < tc.lo && hi > tc.hi) {
				t.Fatalf("range [%v, %v] does not strictly contain the data [%v, %v]", lo, hi, tc.lo, tc.hi)
			}
			// The legend's lines (about 4% of the axis each) fit above
			// the data.
			if above := (hi - tc.hi) / (hi - lo); above < min(0.04*float64(tc.entries), 0.5) {
				t.Errorf("%.0f%% of the axis above the data, too little for %d legend lines", 100*above, tc.entries)
			}
		})
	}
}
