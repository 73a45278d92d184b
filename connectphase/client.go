package connectphase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/protophase"
)

// ClientConfig configures ClientInterceptor. Zero values mean the
// documented default; the defaults are package caller's, so Connect, gRPC
// and HTTP calls retry alike.
type ClientConfig struct {
	// KeyHeader names the header (gRPC metadata) that carries the
	// idempotency key. Defaults to protophase.DefaultKeyMetadata.
	KeyHeader string
	// Key returns the key a request message carries in a field, as the
	// server's MethodConfig.Key reads it: a call whose message carries one
	// is sent under it, in the key header too. A key already in the
	// request's header wins; an empty result means none. Defaults to
	// reading the first of protophase.DefaultKeyFields that the message
	// declares as a string field.
	Key func(req any) string
	// Keyed reports whether calls to procedure are sent under a key and
	// retried. Give the interceptor only procedures a server runs under
	// keys: retrying any other call may run it twice. Defaults to every
	// unary procedure.
	Keyed func(procedure string) bool
	// MaxAttempts, MaxElapsed, BaseDelay and MaxDelay are the retry budget
	// and backoff, as in grpcphase.ClientConfig. Default to
	// caller.DefaultMaxAttempts, caller.DefaultMaxElapsed,
	// caller.DefaultBaseDelay and caller.DefaultMaxDelay.
	MaxAttempts                     int
	MaxElapsed, BaseDelay, MaxDelay time.Duration
	// NewKey makes the key of a call that has none. Defaults to
	// caller.NewKey (a UUIDv7).
	NewKey func() (string, error)
}

// UnknownOutcomeError says that a call ended without an answer the server
// will not change: the work may have been done, or not, or may still be
// running. Calling again later with Key in the key header gets the answer
// without doing the work twice. connect.CodeOf reads the last attempt's
// code from it.
type UnknownOutcomeError struct {
	// Procedure is the call's procedure.
	Procedure string
	// Key is the call's idempotency key, as sent.
	Key string
	// Attempts is how many attempts were sent.
	Attempts int
	// Cause is why retrying stopped: protophase.ErrBudgetExhausted, the
	// error of the call's context, or the last attempt's error.
	Cause error
	// Last is the last attempt's error.
	Last error
}

func (e *UnknownOutcomeError) Error() string {
	return fmt.Sprintf("connectphase: %s: outcome unknown after %d attempts (%v; last attempt: %v); retry later with idempotency key %s",
		e.Procedure, e.Attempts, e.Cause, e.Last, e.Key)
}

// Unwrap returns Cause and Last, so errors.Is finds
// protophase.ErrBudgetExhausted or context.Canceled, and errors.As the
// last *connect.Error.
func (e *UnknownOutcomeError) Unwrap() []error { return []error{e.Cause, e.Last} }

// ClientInterceptor returns a client interceptor that sends each keyed
// unary call under one idempotency key (the request's key header, else the
// message's key field, else a new one) and retries it under that key, with
// the rule of grpcphase.UnaryClientInterceptor: a call ends with the
// answer, with a refusal that proves nothing ran, or with an
// *UnknownOutcomeError that names the key, whether the Connect, gRPC or
// gRPC-Web protocol carries it. Streams pass through untouched.
func ClientInterceptor(cfg ClientConfig) (connect.Interceptor, error) {
	policy := protophase.ClientPolicy{MaxAttempts: cfg.MaxAttempts, MaxElapsed: cfg.MaxElapsed, BaseDelay: cfg.BaseDelay, MaxDelay: cfg.MaxDelay}
	if err := policy.Validate(); err != nil {
		return nil, fmt.Errorf("connectphase: ClientConfig: %w", err)
	}
	cfg.KeyHeader = cmp.Or(cfg.KeyHeader, protophase.DefaultKeyMetadata)
	if cfg.Key == nil {
		cfg.Key = func(req any) string { return protophase.FieldKey(req, protophase.DefaultKeyFields) }
	}
	if cfg.NewKey == nil {
		cfg.NewKey = caller.NewKey
	}
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if !req.Spec().IsClient || cfg.Keyed != nil && !cfg.Keyed(req.Spec().Procedure) {
				return next(ctx, req)
			}
			return cfg.call(ctx, policy, next, req)
		}
	}), nil
}

func (cfg *ClientConfig) call(ctx context.Context, policy protophase.ClientPolicy, next connect.UnaryFunc, req connect.AnyRequest) (connect.AnyResponse, error) {
	key := req.Header().Get(cfg.KeyHeader)
	if key == "" {
		if key = cfg.Key(req.Any()); key == "" {
			var err error
			if key, err = cfg.NewKey(); err != nil {
				return nil, err
			}
		}
		req.Header().Set(cfg.KeyHeader, key)
	}
	var resp connect.AnyResponse
	end := policy.Call(ctx, func(ctx context.Context) protophase.Attempt {
		var err error
		resp, err = next(ctx, req)
		return attempt(err)
	})
	switch {
	case end.Attempts == 0:
		c := connect.CodeCanceled
		if errors.Is(end.Err, context.DeadlineExceeded) {
			c = connect.CodeDeadlineExceeded
		}
		return nil, connect.NewError(c, end.Err)
	case end.Unknown != nil:
		return nil, &UnknownOutcomeError{Procedure: req.Spec().Procedure, Key: key, Attempts: end.Attempts, Cause: end.Unknown, Last: end.Err}
	case end.Err != nil:
		return nil, end.Err
	}
	return resp, nil
}

// attempt describes an attempt that ended with err.
func attempt(err error) protophase.Attempt {
	a := protophase.Attempt{Err: err}
	if err == nil {
		return a
	}
	a.Code = code.Code(connect.CodeOf(err))
	var ce *connect.Error
	if !errors.As(err, &ce) || !connect.IsWireError(err) {
		// The client made this error, not the server: the transport
		// failed or the reply could not be read, after the request may
		// have been sent. A reply too large stays too large however often
		// it is asked for; anything else is worth another attempt.
		if a.Code == code.Code_RESOURCE_EXHAUSTED {
			a.Header = true
		} else {
			a.Code = code.Code_UNAVAILABLE
		}
		return a
	}
	mark := ce.Meta().Values(protophase.ReplayedMetadata)
	a.Header = len(mark) > 0
	// The server sent this status: a mark with it marks the status as the
	// key's stored answer.
	a.Replayed = slices.Contains(mark, "true")
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if ri, ok := v.(*errdetails.RetryInfo); ok {
				a.RetryDelay = ri.GetRetryDelay().AsDuration()
			}
		}
	}
	return a
}
