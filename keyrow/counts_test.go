package keyrow_test

import (
	"testing"

	"github.com/atomicphase/atomicphase/keyrow"
)

// TestCountsAddSumsEveryState: two workflows' counts added give each
// state's sum, the finished keys estimated when either's were.
func TestCountsAddSumsEveryState(t *testing.T) {
	t.Parallel()
	a := keyrow.Counts{Finished: 1, InFlight: 2, Waiting: 3, Stuck: 4, Unknown: 5, Dead: 6}
	b := keyrow.Counts{Finished: 10, FinishedEstimated: true, InFlight: 20, Waiting: 30, Stuck: 40, Unknown: 50, Dead: 60}
	want := keyrow.Counts{Finished: 11, FinishedEstimated: true, InFlight: 22, Waiting: 33, Stuck: 44, Unknown: 55, Dead: 66}
	if got := a.Add(b); got != want {
		t.Errorf("%+v added to %+v = %+v; want %+v", b, a, got, want)
	}
	if got := b.Add(a); got != want {
		t.Errorf("%+v added to %+v = %+v; want %+v", a, b, got, want)
	}
}
