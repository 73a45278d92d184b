package recovery

import (
	"context"
	"sync"

	"github.com/atomicphase/atomicphase/keyrow"
)

// Metrics tallies events by kind, from the completer, the reaper and a
// client's runs alike (Observe); the client's Counts gives the gauges.
// Export its numbers with any metrics library; it is safe for concurrent
// use.
type Metrics struct {
	mu     sync.Mutex
	counts map[string]int64
}

// Observe adds ev, once for a run's event and Count times for an event of
// the completer or reaper; give it to a client as
// phase.ObserverFunc(m.Observe).
func (m *Metrics) Observe(_ context.Context, ev keyrow.Event) {
	m.Count(string(ev.Kind), max(ev.Count, 1))
}

// Count adds n to the tally of kind, a keyrow.EventKind or a name of the
// caller's own.
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
