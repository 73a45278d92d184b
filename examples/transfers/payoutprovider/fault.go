package payoutprovider

import (
	"fmt"
	"time"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
)

// Faults is a Server's plan of failures. Only payout requests about to
// execute draw from it: requests rejected by validation, refused with 409 or
// answered from a stored result never consume a fault. Counts are drawn
// before rates, and a failure before the payout before a drop after it.
type Faults struct {
	// FailBeforePayout is how many of the next payout requests are answered
	// 500 without executing. Nothing is stored under their key, so a retry
	// with the key executes.
	FailBeforePayout int
	// TimeoutAfterPayout is how many of the next payout requests execute in
	// full, committing the payout and its stored result, and then lose their
	// connection after the answer's status line, so the client sees a
	// network error even on a reused keep-alive connection. A retry with the
	// key replays the result.
	TimeoutAfterPayout int
	// FailBeforePayoutRate is the probability, from 0 to 1, that a payout
	// request no count claims fails as FailBeforePayout describes.
	FailBeforePayoutRate float64
	// TimeoutAfterPayoutRate is the probability, from 0 to 1, that a payout
	// request no count or failure claims is dropped as TimeoutAfterPayout
	// describes.
	TimeoutAfterPayoutRate float64
	// Delay is added to every API request. A payout request spends it
	// holding its key, so concurrent requests with the key get 409.
	Delay time.Duration
}

// Faults returns the faults still planned.
func (s *Server) Faults() Faults {
	f := s.api.Faults()
	return Faults{
		FailBeforePayout:       f.FailBefore,
		TimeoutAfterPayout:     f.TimeoutAfter,
		FailBeforePayoutRate:   f.FailBeforeRate,
		TimeoutAfterPayoutRate: f.TimeoutAfterRate,
		Delay:                  f.Delay,
	}
}

// SetFaults replaces the plan with f. It returns an error, and changes
// nothing, when a count or the delay is negative or a rate is not between 0
// and 1.
func (s *Server) SetFaults(f Faults) error {
	_, err := s.api.ChangeFaults(func(plan *fakeapi.Faults) error {
		*plan = fakeapi.Faults{
			FailBefore:       f.FailBeforePayout,
			TimeoutAfter:     f.TimeoutAfterPayout,
			FailBeforeRate:   f.FailBeforePayoutRate,
			TimeoutAfterRate: f.TimeoutAfterPayoutRate,
			Delay:            f.Delay,
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("payoutprovider: %w", err)
	}
	return nil
}
