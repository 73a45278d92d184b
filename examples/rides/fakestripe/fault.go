package fakestripe

import (
	"fmt"
	"time"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

// Faults is a Server's plan of failures (see fakeapi.Faults), which
// Server.Faults returns and Server.SetFaults replaces. Only charge requests
// about to execute draw from it: requests rejected by validation, refused
// with 409 or answered from a stored result never consume a fault.
// FailBefore stands for a failure in front of execution, such as an
// overloaded API host (Stripe itself stores a 500 raised once execution
// began); TimeoutAfter commits the charge, or the decline, and its stored
// result before it drops the connection.
type Faults = fakeapi.Faults

// FailBeforeCharge makes the next n charge requests fail before executing
// (see Faults.FailBefore), replacing any count still pending. n <= 0
// cancels the count.
func (s *Server) FailBeforeCharge(n int) {
	s.change(func(f *Faults) { f.FailBefore = max(n, 0) })
}

// TimeoutAfterCharge makes the next n charge requests lose their connection
// after executing (see Faults.TimeoutAfter), replacing any count still
// pending. n <= 0 cancels the count.
func (s *Server) TimeoutAfterCharge(n int) {
	s.change(func(f *Faults) { f.TimeoutAfter = max(n, 0) })
}

// SetDelay sets the latency added to every API request; d <= 0 removes it.
func (s *Server) SetDelay(d time.Duration) {
	s.change(func(f *Faults) { f.Delay = max(d, 0) })
}

// change makes a change to the plan that keeps it valid, so that it cannot
// be refused.
func (s *Server) change(valid func(*Faults)) {
	s.ChangeFaults(func(f *Faults) error { valid(f); return nil }) //nolint:errcheck // valid keeps the plan valid
}

// SetRates sets the probabilities of a failure before and a drop after the
// charge for requests no count claims. It returns an error, and changes
// nothing, unless both are between 0 and 1.
func (s *Server) SetRates(failBefore, timeoutAfter float64) error {
	_, err := s.ChangeFaults(func(f *Faults) error {
		f.FailBeforeRate, f.TimeoutAfterRate = failBefore, timeoutAfter
		return nil
	})
	if err != nil {
		return fmt.Errorf("fakestripe: %w", err)
	}
	return nil
}
