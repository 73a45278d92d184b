package phase

import (
	"context"
	"time"
)

// WithCallClock returns ctx with the clock a completer's run sums its
// foreign calls' and reconcile functions' time on, and the function that
// reads the sum.
func WithCallClock(ctx context.Context) (context.Context, func() time.Duration) {
	clock := &callClock{}
	return context.WithValue(ctx, callClockKey{}, clock), func() time.Duration { return time.Duration(clock.spent.Load()) }
}
