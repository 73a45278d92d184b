package console

import (
	"cmp"
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase/phase"
)

// The charts' width in SVG units, and their margins; they scale to the
// width of their box.
const (
	chartWidth             = 720.0
	chartLeft, chartBottom = 40.0, 22.0
	chartTop, chartRight   = 8.0, 8.0
)

// frame is the grid of one chart: n points along the time axis, values
// from 0 to top on the other, in a box height units high. Points stand
// pad units in from either end, so that a bar around the first or the last
// stays in the box.
type frame struct {
	n, top      int
	height, pad float64
}

// newFrame returns a frame for n points whose largest value is most,
// rounded up for gridlines a reader can take at a glance.
func newFrame(n, most int, height, pad float64) frame {
	top := max(most, 1)
	for _, step := range []int{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000} {
		if top <= step {
			top = step
			break
		}
	}
	return frame{n: n, top: top, height: height, pad: pad}
}

func (f frame) x(i int) float64 {
	w := chartWidth - chartLeft - chartRight - 2*f.pad
	return chartLeft + f.pad + w*float64(i)/float64(max(f.n-1, 1))
}

func (f frame) y(n int) float64 {
	h := f.height - chartBottom - chartTop
	return chartTop + h*(1-float64(n)/float64(f.top))
}

// open writes the chart's opening tag, its title, the gridlines and the
// axes' labels, the time of point i being at(i).
func (f frame) open(b *strings.Builder, class, id, title string, at func(int) time.Time) {
	fmt.Fprintf(b, `<svg class="%s" viewBox="0 0 %.0f %.0f" role="img" aria-labelledby="%s">`, class, chartWidth, f.height, id)
	fmt.Fprintf(b, `<title id="%s">%s</title>`, id, template.HTMLEscapeString(title))
	for _, n := range []int{0, f.top / 2, f.top} {
		fmt.Fprintf(b, `<line class="grid" x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f"/>`, chartLeft, chartWidth-chartRight, f.y(n), f.y(n))
		fmt.Fprintf(b, `<text class="axis" x="%.1f" y="%.1f" text-anchor="end">%d</text>`, chartLeft-6, f.y(n)+4, n)
	}
	last := f.n - 1
	for _, i := range []int{0, last / 2, last} {
		anchor := map[int]string{0: "start", last: "end"}[i]
		label := fmt.Sprintf("%d min ago", last-i)
		if i == last {
			label = "now"
		}
		fmt.Fprintf(b, `<text class="axis" x="%.1f" y="%.1f" text-anchor="%s">%s <tspan class="utc">%s UTC</tspan></text>`,
			f.x(i), f.height-6, cmp.Or(anchor, "middle"), label, at(i).UTC().Format("15:04"))
	}
}

// chart draws the overview's minutes as an SVG line chart of the keys
// started, finished and put on hold per minute, drawn here so that the
// Content-Security-Policy needs no script or style of another origin. It
// holds numbers and times only, each written by this function.
func chart(minutes []phase.Minute) template.HTML {
	if len(minutes) < 2 {
		return ""
	}
	most := 0
	for _, m := range minutes {
		most = max(most, m.Started, m.Finished, m.Held)
	}
	f := newFrame(len(minutes), most, 180, 0)
	var b strings.Builder
	f.open(&b, "chart", "chart-title", "Keys started, finished and put on hold per minute, the last hour",
		func(i int) time.Time { return minutes[i].At })
	for _, s := range []struct {
		class string
		n     func(phase.Minute) int
	}{
		{"started", func(m phase.Minute) int { return m.Started }},
		{"finished", func(m phase.Minute) int { return m.Finished }},
		{"held", func(m phase.Minute) int { return m.Held }},
	} {
		var pts []string
		for i, m := range minutes {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", f.x(i), f.y(s.n(m))))
		}
		fmt.Fprintf(&b, `<polyline class="line %s" points="%s"/>`, s.class, strings.Join(pts, " "))
		for i, m := range minutes {
			if n := s.n(m); n > 0 {
				fmt.Fprintf(&b, `<circle class="dot %s" cx="%.1f" cy="%.1f" r="2.5"><title>%s UTC: %d %s</title></circle>`,
					s.class, f.x(i), f.y(n), m.At.UTC().Format("15:04"), n, s.class)
			}
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}
