package phase

import (
	"context"

	"github.com/atomicphase/atomicphase/keyrow"
)

// Observer receives every event of a client's runs (see keyrow.Event), with
// the run's context, so a tracer can attach the event to the caller's span.
// It is called synchronously on the run's goroutine and must be fast and
// safe for concurrent use; a metrics or tracing library plugs in here.
type Observer func(ctx context.Context, ev keyrow.Event)
