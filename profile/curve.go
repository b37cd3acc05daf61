package profile

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Series is one line of a curve plot.
type Series struct {
	Name  string
	Color string // SVG color
	X, Y  []float64
	Dots  bool // mark each point (sparse series such as validation)
}

// WriteCurveSVG draws series as lines on shared axes, with ticks and a legend,
// as a self-contained SVG (for loss curves in docs and reports).
func WriteCurveSVG(w io.Writer, title, xLabel, yLabel string, series []Series) error {
	const width, height = 720.0, 400.0
	const left, right, top, bottom = 64.0, 24.0, 40.0, 52.0
	x0, x1, y0, y1 := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("series %s has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		for i := range s.X {
			x0, x1 = math.Min(x0, s.X[i]), math.Max(x1, s.X[i])
			y0, y1 = math.Min(y0, s.Y[i]), math.Max(y1, s.Y[i])
		}
	}
	if math.IsInf(x0, 1) {
		return fmt.Errorf("nothing to plot")
	}
	if x1 == x0 {
		x1 = x0 + 1
	}
	if y1 == y0 {
		y1 = y0 + 1
	}
	pad := (y1 - y0) * 0.05
	y0, y1 = math.Max(0, y0-pad), y1+pad
	px := func(x float64) float64 { return left + (x-x0)/(x1-x0)*(width-left-right) }
	py := func(y float64) float64 { return height - bottom - (y-y0)/(y1-y0)*(height-top-bottom) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, escape(title))
	for _, t := range ticks(y0, y1, 6) {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", left, width-right, py(t), py(t))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, py(t)+4, tickText(t))
	}
	for _, t := range ticks(x0, x1, 8) {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#999"/>`+"\n", px(t), px(t), height-bottom, height-bottom+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(t), height-bottom+18, tickText(t))
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#999"/>`+"\n", left, top, width-left-right, height-top-bottom)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", (left+width-right)/2, height-12, escape(xLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (top+height-bottom)/2, escape(yLabel))
	for i, s := range series {
		var pts []string
		for j := range s.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.X[j]), py(s.Y[j])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.6" points="%s"/>`+"\n", s.Color, strings.Join(pts, " "))
		if s.Dots {
			for j := range s.X {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(s.X[j]), py(s.Y[j]), s.Color)
			}
		}
		ly := top + 16 + 18*float64(i)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`+"\n", width-right-170, width-right-150, ly-4, ly-4, s.Color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", width-right-144, ly, escape(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// ticks returns about n round values spanning [lo, hi].
func ticks(lo, hi float64, n int) []float64 {
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/float64(n))))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= float64(n) {
			step *= m
			break
		}
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, t)
	}
	return out
}

func tickText(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e6 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
