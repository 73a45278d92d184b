package console

import (
	"fmt"
	"html/template"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// heldFirst is the unfinished statuses from the bottom of a bar up: the
// ones that need an operator nearest the axis, where a reader looks first.
var heldFirst = []keyrow.Status{keyrow.StatusDead, keyrow.StatusUnknown, keyrow.StatusStuck,
	keyrow.StatusWaiting, keyrow.StatusInFlight}

// statusChart is one workflow's chart of its unfinished keys by status.
type statusChart struct {
	Workflow string
	SVG      template.HTML
}

// statusCharts draws, for each workflow of history, its unfinished keys
// by status at each minute of minutes as stacked bars, one SVG each, drawn
// here as chart is. A recorded minute has a tick on the axis, so that a
// minute with no unfinished key shows apart from one no completer
// recorded, which has none.
func statusCharts(minutes []phase.Minute, history []phase.StatusMinute) []statusChart {
	if len(minutes) < 2 {
		return nil
	}
	first := minutes[0].At
	slot := func(at time.Time) int { return int(at.Sub(first) / time.Minute) }
	byWorkflow := map[string][]phase.StatusMinute{}
	for _, m := range history {
		if i := slot(m.At); i >= 0 && i < len(minutes) {
			byWorkflow[m.Workflow] = append(byWorkflow[m.Workflow], m)
		}
	}
	var charts []statusChart
	for _, name := range slices.Sorted(maps.Keys(byWorkflow)) {
		recorded := byWorkflow[name]
		most := 0
		for _, m := range recorded {
			most = max(most, m.Unfinished())
		}
		f := newFrame(len(minutes), most, 130, 5)
		barW := (chartWidth - chartLeft - chartRight) / float64(len(minutes)) * 0.8
		var b strings.Builder
		f.open(&b, "chart status-chart", "status-chart-"+fmt.Sprint(len(charts)),
			"Unfinished keys of "+name+" by state per minute, the last hour", func(i int) time.Time { return minutes[i].At })
		for _, m := range recorded {
			x := f.x(slot(m.At)) - barW/2
			fmt.Fprintf(&b, `<g class="minute"><title>%s UTC: %s</title>`, m.At.UTC().Format("15:04"), barTitle(m.Counts))
			fmt.Fprintf(&b, `<rect class="rec" x="%.1f" y="%.1f" width="%.1f" height="2"/>`, x, f.y(0), barW)
			below := 0
			for _, s := range heldFirst {
				n := count(m.Counts, s)
				if n == 0 {
					continue
				}
				fmt.Fprintf(&b, `<rect class="bar %s" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`,
					s, x, f.y(below+n), barW, f.y(below)-f.y(below+n))
				below += n
			}
			b.WriteString(`</g>`)
		}
		b.WriteString(`</svg>`)
		charts = append(charts, statusChart{Workflow: name, SVG: template.HTML(b.String())})
	}
	return charts
}

// barTitle is a bar's counts in words, statuses as the pages name them:
// "2 in flight, 0 waiting, 1 stuck, 0 unknown, 1 dead".
func barTitle(c keyrow.Counts) string {
	var parts []string
	for _, s := range states {
		if s != keyrow.StatusFinished {
			parts = append(parts, fmt.Sprintf("%d %s", count(c, s), label(s)))
		}
	}
	return strings.Join(parts, ", ")
}
