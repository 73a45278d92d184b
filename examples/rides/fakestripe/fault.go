package fakestripe

import (
	"fmt"
	"time"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

// Faults is a Server's plan of failures. Only charge requests about to
// execute draw from it: requests rejected by validation, refused with 409 or
// answered from a stored result never consume a fault. Counts are drawn
// before rates, and a failure before the charge before a drop after it, so
// FailBeforeCharge 1 with TimeoutAfterCharge 1 fails one request and drops
// the next.
type Faults struct {
	// FailBeforeCharge is how many of the next charge requests are answered
	// 500 api_error without executing. Nothing is stored under their
	// idempotency key, because nothing ran, so a retry with the key executes.
	// (Stripe stores a 500 raised once execution began; these stand for a
	// failure in front of execution, such as an overloaded API host.)
	FailBeforeCharge int
	// TimeoutAfterCharge is how many of the next charge requests execute in
	// full, committing the charge (or the decline) and its stored result,
	// and then lose their connection after the answer's status line, so the
	// client sees a network error, on a reused keep-alive connection too. A
	// retry with the key replays the stored result.
	TimeoutAfterCharge int
	// FailBeforeChargeRate is the probability, from 0 to 1, that a charge
	// request no count claims fails as FailBeforeCharge describes.
	FailBeforeChargeRate float64
	// TimeoutAfterChargeRate is the probability, from 0 to 1, that a charge
	// request no count or failure claims is dropped as TimeoutAfterCharge
	// describes.
	TimeoutAfterChargeRate float64
	// Delay is added to every authenticated API request. A charge request
	// spends it holding its idempotency key, so concurrent requests with
	// the key are refused with 409 meanwhile.
	Delay time.Duration
}

// Faults returns the faults still planned.
func (s *Server) Faults() Faults {
	f := s.api.Faults()
	return Faults{
		FailBeforeCharge:       f.FailBefore,
		TimeoutAfterCharge:     f.TimeoutAfter,
		FailBeforeChargeRate:   f.FailBeforeRate,
		TimeoutAfterChargeRate: f.TimeoutAfterRate,
		Delay:                  f.Delay,
	}
}

// FailBeforeCharge makes the next n charge requests fail before executing
// (see Faults.FailBeforeCharge), replacing any count still pending. n <= 0
// cancels the count.
func (s *Server) FailBeforeCharge(n int) {
	s.change(func(f *fakeapi.Faults) { f.FailBefore = max(n, 0) })
}

// TimeoutAfterCharge makes the next n charge requests lose their connection
// after executing (see Faults.TimeoutAfterCharge), replacing any count still
// pending. n <= 0 cancels the count.
func (s *Server) TimeoutAfterCharge(n int) {
	s.change(func(f *fakeapi.Faults) { f.TimeoutAfter = max(n, 0) })
}

// SetDelay sets the latency added to every API request; d <= 0 removes it.
func (s *Server) SetDelay(d time.Duration) {
	s.change(func(f *fakeapi.Faults) { f.Delay = max(d, 0) })
}

// change makes a change to the plan that keeps it valid, so that it cannot
// be refused.
func (s *Server) change(valid func(*fakeapi.Faults)) {
	s.api.ChangeFaults(func(f *fakeapi.Faults) error { valid(f); return nil }) //nolint:errcheck // valid keeps the plan valid
}

// SetRates sets the probabilities of a failure before and a drop after the
// charge for requests no count claims. It returns an error, and changes
// nothing, unless both are between 0 and 1.
func (s *Server) SetRates(failBefore, timeoutAfter float64) error {
	_, err := s.api.ChangeFaults(func(f *fakeapi.Faults) error {
		f.FailBeforeRate, f.TimeoutAfterRate = failBefore, timeoutAfter
		return nil
	})
	if err != nil {
		return fmt.Errorf("fakestripe: %w", err)
	}
	return nil
}
