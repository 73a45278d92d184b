package console

import (
	"cmp"
	"fmt"
	"html/template"
	"strings"

	"github.com/atomicphase/atomicphase/phase"
)

// The chart's size in SVG units; it scales to the width of its box.
const (
	chartWidth, chartHeight = 720.0, 180.0
	chartLeft, chartBottom  = 40.0, 22.0
)

// chart draws the overview's minutes as an SVG line chart of the keys
// started, finished and put on hold per minute, drawn here so that the
// Content-Security-Policy needs no script or style of another origin. It
// holds numbers and times only, each written by this function.
func chart(minutes []phase.Minute) template.HTML {
	if len(minutes) < 2 {
		return ""
	}
	top := 1
	for _, m := range minutes {
		top = max(top, m.Started, m.Finished, m.Held)
	}
	// A round top, for gridlines a reader can take at a glance.
	for _, step := range []int{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000} {
		if top <= step {
			top = step
			break
		}
	}
	plotW, plotH := chartWidth-chartLeft-8, chartHeight-chartBottom-8
	x := func(i int) float64 { return chartLeft + plotW*float64(i)/float64(len(minutes)-1) }
	y := func(n int) float64 { return 8 + plotH*(1-float64(n)/float64(top)) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-labelledby="chart-title">`, chartWidth, chartHeight)
	b.WriteString(`<title id="chart-title">Keys started, finished and put on hold per minute, the last hour</title>`)
	for _, n := range []int{0, top / 2, top} {
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f"/>`, chartLeft, chartWidth-8, y(n), y(n))
		fmt.Fprintf(&b, `<text class="axis" x="%.1f" y="%.1f" text-anchor="end">%d</text>`, chartLeft-6, y(n)+4, n)
	}
	last := len(minutes) - 1
	for _, i := range []int{0, last / 2, last} {
		anchor := map[int]string{0: "start", last: "end"}[i]
		label := fmt.Sprintf("%d min ago", last-i)
		if i == last {
			label = "now"
		}
		fmt.Fprintf(&b, `<text class="axis" x="%.1f" y="%.1f" text-anchor="%s">%s <tspan class="utc">%s UTC</tspan></text>`,
			x(i), chartHeight-6, cmp.Or(anchor, "middle"), label, minutes[i].At.UTC().Format("15:04"))
	}
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
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(s.n(m))))
		}
		fmt.Fprintf(&b, `<polyline class="line %s" points="%s"/>`, s.class, strings.Join(pts, " "))
		for i, m := range minutes {
			if n := s.n(m); n > 0 {
				fmt.Fprintf(&b, `<circle class="dot %s" cx="%.1f" cy="%.1f" r="2.5"><title>%s UTC: %d %s</title></circle>`,
					s.class, x(i), y(n), m.At.UTC().Format("15:04"), n, s.class)
			}
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}
