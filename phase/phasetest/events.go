package phasetest

import (
	"context"
	"sync"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// Events records a client's events for a test to count; it is a
// phase.Observer: give it in phase.Config.Hooks. It is safe for concurrent
// use.
type Events struct {
	phase.HookDefaults
	mu     sync.Mutex
	events []keyrow.Event
}

// Observe records ev.
func (l *Events) Observe(_ context.Context, ev keyrow.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
}

// Count returns how many events of kind were recorded.
func (l *Events) Count(kind keyrow.EventKind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ev := range l.events {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// Of returns the events recorded for key, in order.
func (l *Events) Of(key string) []keyrow.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []keyrow.Event
	for _, ev := range l.events {
		if ev.Key == key {
			out = append(out, ev)
		}
	}
	return out
}
