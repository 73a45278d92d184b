package phase_test

import (
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// TestBacklogRateIsTheFallOfTheCompletersKeysSinceTheNewestMinute: the
// rate runs from the newest minute recorded at least DrainSpan ago to the keys
// counted now, so a drain in progress shows before the next minute is
// recorded; keys passing from waiting to stuck are neither a drain nor
// growth; and neither the first minute of a series nor a minute younger
// than DrainSpan is measured from.
func TestBacklogRateIsTheFallOfTheCompletersKeysSinceTheNewestMinute(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 12, 3, 5, 0, 0, 0, time.UTC)
	minutes := func(counts ...keyrow.Counts) []phase.StatusMinute {
		var ms []phase.StatusMinute
		for i, c := range counts {
			ms = append(ms, phase.StatusMinute{At: base.Add(time.Duration(i) * time.Minute), Workflow: "rides", Counts: c})
		}
		return ms
	}
	stuck := func(n ...int) []phase.StatusMinute {
		var cs []keyrow.Counts
		for _, n := range n {
			cs = append(cs, keyrow.Counts{Stuck: n})
		}
		return minutes(cs...)
	}
	for _, c := range []struct {
		name       string
		ms         []phase.StatusMinute
		now        time.Duration
		unfinished int
		rate       float64
		over       time.Duration
		measured   bool
	}{
		{"a drain in progress", stuck(1500, 1500, 1500, 1500), 3*time.Minute + 40*time.Second, 500, 25, 40 * time.Second, true},
		{"a drain in the first seconds of a minute", stuck(1500, 1500, 1500, 1500), 3*time.Minute + 10*time.Second, 800, 10, 70 * time.Second, true},
		{"keys becoming stuck", minutes(keyrow.Counts{Waiting: 2000}, keyrow.Counts{Waiting: 1000, Stuck: 1000},
			keyrow.Counts{InFlight: 4, Stuck: 1996}), 3 * time.Minute, 2000, 0, 60 * time.Second, true},
		{"a rising backlog", stuck(0, 600, 1200, 1800), 3 * time.Minute, 2400, -20, 60 * time.Second, true},
		{"the first minute is not measured from", stuck(9000), 5 * time.Minute, 0, 0, 0, false},
		{"a minute younger than DrainSpan is not measured from", stuck(9000, 60), 70 * time.Second, 0, 0, 0, false},
	} {
		rate, over, measured := phase.DrainRate(c.ms, base.Add(c.now), c.unfinished)
		if rate != c.rate || over != c.over || measured != c.measured {
			t.Errorf("%s: %.2f a second over %v, measured %v; want %.2f over %v, %v", c.name, rate, over, measured, c.rate, c.over, c.measured)
		}
	}
}

// TestBacklogSaysHowLongItsUnfinishedKeysTake: the time to empty counts the
// keys waiting out a backoff too, and a backlog whose keys do not fall
// says it is not draining.
func TestBacklogSaysHowLongItsUnfinishedKeysTake(t *testing.T) {
	t.Parallel()
	b := phase.Backlog{Keys: 600, Unfinished: 1000, PerSecond: 10, Over: 80 * time.Second, Measured: true}
	if d, ok := b.EmptyIn(); !ok || d != 100*time.Second {
		t.Errorf("%+v empty in %v, %v; want 1m40s", b, d, ok)
	}
	if got, want := b.Rate(), "draining 10.0 a second over the last 1m20s, empty in about 1m40s"; got != want {
		t.Errorf("rate %q; want %q", got, want)
	}
	b.PerSecond = 0
	if got, want := b.Rate(), "not draining over the last 1m20s"; got != want {
		t.Errorf("rate %q; want %q", got, want)
	}
	b.PerSecond = -2.5
	if got, want := b.Rate(), "growing by 2.5 a second over the last 1m20s"; got != want {
		t.Errorf("rate %q; want %q", got, want)
	}
}
