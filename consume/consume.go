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
// # Retries
//
// A message is dropped only when delivering it again can never help: its
// payload is malformed, its id was first used with another payload, or
// its tenant is refused. Anything transient (the key store, a provider, a
// lookup of the consumer's own) is retried, as the HTTP handler answers it
// with 503 and Retry-After: [Verdict.Backoff] spaces the deliveries,
// doubling from [DefaultRetryDelay] up to [MaxRetryDelay], and never
// sooner than the run asked ([Verdict.Delay]). A consumer that stops
// retrying after a number of deliveries leaves the message where an
// operator sees it (a dead-letter subject, a discarded job) and the key
// as it was: a later delivery, the completer or an operator finishes it.
//
// The package depends on nothing but the library. examples/payouts is the
// recipe for River jobs, and module natsphase applies it to JetStream; see
// docs/consumers.md.
package consume

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// DefaultRetryDelay is the pause before a message whose run failed is
// delivered again, when the run does not say how long to wait: the first
// step of [Verdict.Backoff].
const DefaultRetryDelay = time.Second

// MaxRetryDelay is the longest pause [Verdict.Backoff] returns, unless the
// run asked for a longer one.
const MaxRetryDelay = 5 * time.Minute

// Action is what a consumer does with a message once its run ended.
type Action int

// The actions, in the words of most brokers.
const (
	// Ack: the workflow finished (now, or earlier for a duplicate) and its
	// answer is stored. Acknowledge the message.
	Ack Action = iota
	// Retry: the message must be delivered again, after Verdict.Backoff
	// of its delivery count (at least Verdict.Delay): its key is in
	// flight in another delivery, on hold, owned by another deploy, or its
	// run or the reading of its id, tenant or payload failed in a way a
	// later delivery may not (Verdict.Err). Nak it with that delay (River:
	// snooze a job whose key is in flight, fail it otherwise, so that
	// River's retry policy spaces and ends its attempts).
	Retry
	// Drop: delivering the message again cannot help: its id was first
	// used with another payload, its payload is malformed, its tenant is
	// refused, or it can never be stored (Verdict.Err). Terminate it
	// (River: cancel the job) where an operator sees it, and alert.
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
	// Delay is the least pause before the next delivery, for Retry: the
	// time the key's lease has left (phase.Outcome.LeaseLeft, not capped
	// as an HTTP Retry-After is), the pause an error of the run asks
	// for through a method RetryAfter() time.Duration (a provider's
	// Retry-After, wrapped with %w), or DefaultRetryDelay.
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

// hintOf returns the pause an error in err's chain asks for through a
// method RetryAfter() time.Duration (a provider's Retry-After), or 0.
func hintOf(err error) time.Duration {
	var h interface{ RetryAfter() time.Duration }
	if errors.As(err, &h) {
		return h.RetryAfter()
	}
	return 0
}

// ReadFailed is the verdict for a message whose id, tenant or payload
// could not be read, err saying why: Retry when err wraps
// phase.ErrUnavailable (the store of a lookup is down, as the HTTP
// handler's Tenant and Decode functions say it), is a context's error (the
// consumer is stopping), or is a *phase.PanicError (a bug a deploy fixes);
// Drop otherwise, for a malformed message or a refused tenant.
func ReadFailed(err error) Verdict {
	var pe *phase.PanicError
	if errors.Is(err, phase.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &pe) {
		return Verdict{Action: Retry, Delay: max(hintOf(err), DefaultRetryDelay), Err: err}
	}
	return Verdict{Action: Drop, Err: err}
}

// Backoff returns the pause before the next delivery of a message whose
// attempt-th delivery (counting from 1) got v, a Retry: DefaultRetryDelay
// doubled for each earlier delivery, at most MaxRetryDelay, less up to a
// quarter at random so that messages failed together do not return
// together, and never shorter than v.Delay, the pause the run asked for.
func (v Verdict) Backoff(attempt int) time.Duration {
	d := MaxRetryDelay
	if attempt < 20 { // beyond, the cap holds and the shift could overflow
		d = min(DefaultRetryDelay<<max(attempt-1, 0), MaxRetryDelay)
	}
	d -= rand.N(d/4 + 1)
	return max(d, v.Delay)
}

// verdictOf maps a run's end to a verdict.
func verdictOf(out *phase.Outcome, err error) Verdict {
	switch {
	case errors.Is(err, phase.ErrCrash):
		return Verdict{Action: Abandon, Err: err}
	case errors.Is(err, keyrow.ErrKeyInvalid), errors.Is(err, keyrow.ErrInvalidTenant), errors.Is(err, phase.ErrInvalidRequest):
		return Verdict{Action: Drop, Err: err}
	case err != nil:
		// A store outage, a timeout, a lost lease, an unknown outcome, a
		// failed phase, a workflow this deploy does not register: nothing
		// of the failed step was kept, and the next delivery resumes after
		// the last committed phase.
		return Verdict{Action: Retry, Delay: max(hintOf(err), DefaultRetryDelay), Err: err}
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
	// A key in flight waits out its lease, however long: a consumer that
	// retried sooner would spend its deliveries on a holder that died.
	return Verdict{Action: Retry, Delay: max(out.RetryAfter, out.LeaseLeft, DefaultRetryDelay), Outcome: out}
}
