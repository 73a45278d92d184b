package protophase

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/atomicphase/atomicphase/caller"
)

// ErrBudgetExhausted is the cause of an unknown outcome when a call used up
// its attempts or its time (ClientPolicy.MaxAttempts, MaxElapsed).
var ErrBudgetExhausted = errors.New("retry budget exhausted")

// DefaultKeyFields are the request fields a client interceptor reads a key
// from, in this order, when the request message declares one as a string:
// Google's AIP-155 request_id and AEP-155's idempotency_key.
var DefaultKeyFields = []string{"request_id", "idempotency_key"}

// FieldKey returns the value of the first of fields that msg declares as a
// singular string field, or "" when none is declared or set.
func FieldKey(msg any, fields []string) string {
	m, ok := msg.(proto.Message)
	if !ok || m == nil {
		return ""
	}
	r := m.ProtoReflect()
	for _, name := range fields {
		fd := r.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.IsMap() {
			continue
		}
		return r.Get(fd).String()
	}
	return ""
}

// ClientPolicy is the retry rule that grpcphase's and connectphase's client
// interceptors share with package caller: one key for every attempt, full
// jitter between attempts, the server's retry delay honoured, and a call
// that ends with the answer, with a refusal that proves nothing ran, or
// with an unknown outcome that keeps the key. Zero values mean caller's
// defaults.
type ClientPolicy struct {
	MaxAttempts                     int
	MaxElapsed, BaseDelay, MaxDelay time.Duration
}

// Validate returns an error when a field is out of range.
func (p ClientPolicy) Validate() error {
	if p.MaxAttempts < 0 || p.BaseDelay < 0 || p.MaxDelay < 0 || p.MaxElapsed < -1 {
		return errors.New("MaxAttempts, BaseDelay and MaxDelay must not be negative, nor MaxElapsed below -1")
	}
	return nil
}

// Attempt is how one attempt of a keyed call ended, as a client
// interceptor saw it.
type Attempt struct {
	// Err is the attempt's error; nil for an answer.
	Err error
	// Code is Err's status code.
	Code code.Code
	// Replayed reports an error status marked as the key's stored answer
	// (ReplayedMetadata in its trailer or error metadata). A mark in the
	// header metadata alone proves nothing: the message that should follow
	// it may be lost.
	Replayed bool
	// Header reports that the server's response headers arrived.
	Header bool
	// RetryDelay is the RetryInfo delay of Err's status.
	RetryDelay time.Duration
}

// Ending is how a keyed call ended. With no attempt sent, Err is the
// error of a context that had ended before the call.
type Ending struct {
	// Err is the answer's error (nil for an answer), or the last
	// attempt's error when the outcome is unknown.
	Err error
	// Attempts is how many attempts were sent.
	Attempts int
	// Unknown is non-nil when the outcome is unknown: why retrying
	// stopped, ErrBudgetExhausted or the cause of the call's context, or
	// the last attempt's error when that alone makes it unknown.
	Unknown error
}

// Call sends attempt until the call ends, and says how.
//
// An answer (no error), an error marked replayed, and a status no retry
// can change end the call with that answer. UNAVAILABLE, ABORTED,
// INTERNAL, UNKNOWN, and DEADLINE_EXCEEDED or CANCELLED that did not come
// from the call's own context, are retried, after the status's RetryInfo
// delay when it is longer than the backoff; an ABORTED with a delay (the
// key is in flight) counts toward MaxElapsed only, not MaxAttempts.
// RESOURCE_EXHAUSTED is retried
// when it carries a delay (a rate limit); otherwise it is the transport
// refusing a message too large, which is an answer when it came before
// the server's headers (nothing ran) and an unknown outcome after them (the
// reply was too large to read). Once the call's context or the budget ends,
// during an attempt or a pause, the outcome is unknown. A context that
// ended before the first attempt ends the call with its status: nothing
// was sent.
func (p ClientPolicy) Call(ctx context.Context, attempt func(ctx context.Context) Attempt) Ending {
	p.MaxAttempts = cmp.Or(p.MaxAttempts, caller.DefaultMaxAttempts)
	p.MaxElapsed = cmp.Or(p.MaxElapsed, caller.DefaultMaxElapsed)
	p.BaseDelay = cmp.Or(p.BaseDelay, caller.DefaultBaseDelay)
	p.MaxDelay = cmp.Or(p.MaxDelay, caller.DefaultMaxDelay)
	if err := ctx.Err(); err != nil {
		return Ending{Err: err}
	}
	own, hasOwn := ctx.Deadline()
	if p.MaxElapsed > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, p.MaxElapsed, ErrBudgetExhausted)
		defer cancel()
	}
	counted := 0 // attempts that count toward MaxAttempts
	for n := 1; ; n++ {
		a := attempt(ctx)
		end := Ending{Err: a.Err, Attempts: n}
		if a.Err == nil || a.Replayed {
			return end
		}
		if ctx.Err() != nil {
			// The attempt may have run, whatever status the transport
			// made of the context's end.
			end.Unknown = context.Cause(ctx)
			return end
		}
		switch retried(a) {
		case answer:
			return end
		case unknown:
			end.Unknown = a.Err
			return end
		}
		end.Unknown = ErrBudgetExhausted
		// A live server that says the key is in flight and when to come
		// back is polled within MaxElapsed, not counted as a failure.
		if a.Code != code.Code_ABORTED || a.RetryDelay == 0 {
			counted++
		}
		if counted >= p.MaxAttempts {
			return end
		}
		pause := max(p.backoff(n), a.RetryDelay)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < pause {
			// Sleeping past the deadline would only end the call later.
			if hasOwn && !own.After(deadline) {
				end.Unknown = context.DeadlineExceeded
			}
			return end
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			end.Unknown = context.Cause(ctx)
			return end
		case <-t.C:
		}
	}
}

type verdict int

const (
	retry verdict = iota
	answer
	unknown
)

// retried says what an attempt that failed while the call's context was
// alive leads to.
func retried(a Attempt) verdict {
	switch a.Code {
	case code.Code_UNAVAILABLE, code.Code_ABORTED, code.Code_INTERNAL, code.Code_UNKNOWN,
		code.Code_DEADLINE_EXCEEDED, code.Code_CANCELLED:
		// DEADLINE_EXCEEDED and CANCELLED with the context alive came from
		// the server or a proxy.
		return retry
	case code.Code_RESOURCE_EXHAUSTED:
		switch {
		case a.RetryDelay > 0:
			return retry
		case a.Header:
			return unknown
		}
	}
	return answer
}

// backoff is the full-jitter pause before the retry that follows attempt n.
func (p ClientPolicy) backoff(n int) time.Duration {
	ceiling := p.MaxDelay
	if shift := n - 1; shift < 32 && p.BaseDelay<<shift < ceiling && p.BaseDelay<<shift > 0 {
		ceiling = p.BaseDelay << shift
	}
	return rand.N(ceiling + 1)
}
