package phase_test

import (
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// TestBacklogRateCountsFromThePeak: a backlog that formed within the
// window drains from its peak; the quiet minutes before it do not make a
// drain read as growth. A backlog still rising counts from the oldest
// minute, and the first minute of a series is never measured from.
func TestBacklogRateCountsFromThePeak(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 12, 3, 5, 0, 0, 0, time.UTC)
	minutes := func(stuck ...int) []phase.StatusMinute {
		var ms []phase.StatusMinute
		for i, n := range stuck {
			ms = append(ms, phase.StatusMinute{At: base.Add(time.Duration(i) * time.Minute), Workflow: "rides",
				Counts: keyrow.Counts{Stuck: n}})
		}
		return ms
	}
	for _, c := range []struct {
		name     string
		ms       []phase.StatusMinute
		rate     float64
		measured bool
	}{
		{"a drain after quiet minutes", minutes(0, 0, 3000, 1200), 30, true},
		{"a steady drain", minutes(9000, 6000, 3000, 1200), 40, true},
		{"a rising backlog", minutes(0, 600, 1200, 1800), -10, true},
		{"the first minute is not measured from", minutes(9000, 60), 0, false},
	} {
		rate, measured := phase.DrainRate(c.ms)
		if rate != c.rate || measured != c.measured {
			t.Errorf("%s: %.2f a second, measured %v; want %.2f, %v", c.name, rate, measured, c.rate, c.measured)
		}
	}
}
