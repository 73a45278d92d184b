package recovery

import (
	"context"
	"sync"
)

// Metrics tallies events by kind, from the completer and reaper (Observe)
// and from a client's runs (Count, fed from phase.Config.Observer); the
// client's Counts gives the gauges. Export its numbers with any metrics library; it is safe
// for concurrent use.
type Metrics struct {
	mu     sync.Mutex
	counts map[string]int64
}

// Observe adds a completer or reaper event; use it as an Observer.
func (m *Metrics) Observe(_ context.Context, ev Event) { m.Count(string(ev.Kind), ev.Count) }

// Count adds n to the tally of kind, for example a phase.EventKind.
func (m *Metrics) Count(kind string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.counts == nil {
		m.counts = map[string]int64{}
	}
	m.counts[kind] += int64(n)
}

// Snapshot returns a copy of the tallies by kind.
func (m *Metrics) Snapshot() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int64, len(m.counts))
	for k, v := range m.counts {
		out[k] = v
	}
	return out
}
