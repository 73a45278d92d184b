// Package consume runs a workflow once per message for consumers of
// messages delivered at least once: a River job, a NATS JetStream or Kafka
// message. The message's id is the idempotency key, so a redelivery after
// a crash resumes the workflow after its last committed phase, and a
// duplicate delivery of a finished message replays its stored answer
// without running anything. [Run] says what to do with the message once
// the run ends ([Verdict]): acknowledge it only after the workflow
// finished, redeliver it later, drop it, or leave it as a killed consumer
// would.
//
// The package depends on nothing but the library. examples/payouts is the
// recipe for River jobs, and module natsphase applies it to JetStream; see
// docs/consumers.md.
package consume

import (
	"context"
	"errors"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// DefaultRetryDelay is the pause before a message whose run failed is
// delivered again, when the run does not say how long to wait.
const DefaultRetryDelay = time.Second

// Action is what a consumer does with a message once its run ended.
type Action int

// The actions, in the words of most brokers.
const (
	// Ack: the workflow finished (now, or earlier for a duplicate) and its
	// answer is stored. Acknowledge the message.
	Ack Action = iota
	// Retry: the message must be delivered again after Verdict.Delay: its
	// key is in flight in another delivery, on hold, owned by another
	// deploy, or its run failed in a way the next delivery resumes
	// (Verdict.Err). Nack it with that delay (River: snooze the job).
	Retry
	// Drop: delivering the message again cannot help: its id was first
	// used with another payload, or it can never be stored (Verdict.Err).
	// Terminate it (River: cancel the job) and alert.
	Drop
	// Abandon: the run was stopped as a killed process would stop
	// (phase.ErrCrash, injected by tests): neither acknowledge nor nack,
	// and let the broker deliver it again once its ack deadline passes.
	Abandon
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Drop:
		return "drop"
	case Abandon:
		return "abandon"
	}
	return "unknown"
}

// Verdict is what became of one delivery of a message.
type Verdict struct {
	Action Action
	// Delay is the least pause before the next delivery, for Retry.
	Delay time.Duration
	// Outcome is the run's outcome, when it ended without an error: its
	// Kind tells a first run (new, resumed) from a duplicate (replayed),
	// and Response is the stored answer.
	Outcome *phase.Outcome
	// Err is why the run failed, for Retry, Drop and Abandon.
	Err error
}

// ErrReused is the Verdict.Err of a message whose id was first used with
// another payload.
var ErrReused = errors.New("consume: the message id was already used with another payload")

// Run runs req, the payload of the message id, under the key (tenant,
// id), and says what to do with the message. Acknowledge it only when the
// verdict is Ack: the answer is then stored, and any later delivery
// replays it.
func Run[Req, State any](ctx context.Context, c *phase.Client, w *phase.Workflow[Req, State], tenant, id string, req Req) Verdict {
	out, err := w.Run(ctx, c, tenant, id, req)
	return verdictOf(out, err)
}

// verdictOf maps a run's end to a verdict.
func verdictOf(out *phase.Outcome, err error) Verdict {
	switch {
	case errors.Is(err, phase.ErrCrash):
		return Verdict{Action: Abandon, Err: err}
	case errors.Is(err, keyrow.ErrKeyInvalid), errors.Is(err, keyrow.ErrInvalidTenant), errors.Is(err, phase.ErrInvalidRequest),
		errors.Is(err, phase.ErrNotRegistered):
		return Verdict{Action: Drop, Err: err}
	case err != nil:
		// A store outage, a timeout, a lost lease, an unknown outcome, a
		// failed phase: nothing of the failed step was kept, and the next
		// delivery resumes after the last committed phase.
		return Verdict{Action: Retry, Delay: DefaultRetryDelay, Err: err}
	}
	switch out.Kind {
	case phase.OutcomeNew, phase.OutcomeResumed, phase.OutcomeReplayed:
		return Verdict{Action: Ack, Outcome: out}
	case phase.OutcomeMismatch:
		return Verdict{Action: Drop, Outcome: out, Err: ErrReused}
	}
	// In flight, on hold, elsewhere: the key is not this delivery's to run
	// now. Acknowledging it would lose the message if the run that holds
	// the key dies before it finishes.
	return Verdict{Action: Retry, Delay: max(out.RetryAfter, DefaultRetryDelay), Outcome: out}
}
