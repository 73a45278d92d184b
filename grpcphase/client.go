package grpcphase

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/protophase"
)

// ClientConfig configures UnaryClientInterceptor. Zero values mean the
// documented default; the defaults are package caller's, so gRPC and HTTP
// calls retry alike.
type ClientConfig struct {
	// KeyMetadata names the metadata that carries the idempotency key.
	// Defaults to protophase.DefaultKeyMetadata, "idempotency-key".
	KeyMetadata string
	// Key returns the key a request message carries in a field, as the
	// server's MethodConfig.Key reads it (Google's AIP-155 request_id): a
	// call whose message carries one is sent under it, in the key metadata
	// too, so that the server finds the same key in both. A key already in
	// the call's metadata wins; an empty result means none. Defaults to
	// reading the first of protophase.DefaultKeyFields (request_id,
	// idempotency_key) that the message declares as a string field.
	Key func(req any) string
	// Keyed reports whether calls to fullMethod are sent under a key and
	// retried. Give the interceptor only methods a server runs under keys:
	// retrying any other call may run it twice. Defaults to every unary
	// method.
	Keyed func(fullMethod string) bool
	// MaxAttempts is how many attempts one call may take, the first
	// included. Defaults to caller.DefaultMaxAttempts; 1 disables retries.
	MaxAttempts int
	// MaxElapsed bounds one call, its attempts and the pauses between them,
	// under the call's own context. Defaults to caller.DefaultMaxElapsed;
	// -1 leaves the context as the only bound.
	MaxElapsed time.Duration
	// BaseDelay and MaxDelay shape the pause before a retry: a uniformly
	// random duration between zero and BaseDelay doubled for each earlier
	// retry, capped at MaxDelay, or the status's RetryInfo delay when that
	// is longer. Default to caller.DefaultBaseDelay and
	// caller.DefaultMaxDelay.
	BaseDelay, MaxDelay time.Duration
	// NewKey makes the key of a call that has none. Defaults to
	// caller.NewKey (a UUIDv7).
	NewKey func() (string, error)
}

// ErrBudgetExhausted is the cause in an UnknownOutcomeError when the call
// used up ClientConfig.MaxAttempts or ClientConfig.MaxElapsed. It is
// protophase.ErrBudgetExhausted, which connectphase's client returns too.
var ErrBudgetExhausted = protophase.ErrBudgetExhausted

// UnknownOutcomeError says that a call ended without an answer the server
// will not change: the work may have been done, or not, or may still be
// running. Calling again later with Key in the key metadata gets the
// answer without doing the work twice. Its GRPCStatus is the last
// attempt's, so code that switches on status codes still works.
type UnknownOutcomeError struct {
	// Method is the call's full method name.
	Method string
	// Key is the call's idempotency key, as sent.
	Key string
	// Attempts is how many attempts were sent.
	Attempts int
	// Cause is why retrying stopped: ErrBudgetExhausted, or the error of
	// the call's context.
	Cause error
	// Last is the last attempt's error.
	Last error
}

func (e *UnknownOutcomeError) Error() string {
	return fmt.Sprintf("grpcphase: %s: outcome unknown after %d attempts (%v; last attempt: %v); retry later with idempotency key %s",
		e.Method, e.Attempts, e.Cause, e.Last, e.Key)
}

// Unwrap returns Cause and Last, so errors.Is finds ErrBudgetExhausted or
// context.Canceled.
func (e *UnknownOutcomeError) Unwrap() []error { return []error{e.Cause, e.Last} }

// GRPCStatus returns the last attempt's status.
func (e *UnknownOutcomeError) GRPCStatus() *status.Status { return status.Convert(e.Last) }

// Replayed reports whether md, the header metadata of a call (see
// grpc.Header), marks its answer as replayed from the key's stored one. A
// replayed error status is marked in its trailer metadata too (see
// grpc.Trailer), which is where a client finds it when the server sent the
// status without headers.
func Replayed(md metadata.MD) bool {
	return slices.Contains(md.Get(protophase.ReplayedMetadata), "true")
}

// UnaryClientInterceptor returns an interceptor that sends each keyed
// call under one idempotency key (the key metadata already in the call's
// outgoing context, else the request's key field, else a new one) and
// retries it under that key until it has an answer the server will not
// change. A call ends in one of three ways, whatever happens on the way:
//
//   - the answer: OK, an error status marked replayed in its trailer
//     metadata (the key's stored answer), or a status no retry changes
//     (INVALID_ARGUMENT, FAILED_PRECONDITION, UNAUTHENTICATED, ...);
//   - a refusal that proves nothing ran: a context that had ended before
//     the call, or RESOURCE_EXHAUSTED before any response header (a
//     message too large for the transport);
//   - an *UnknownOutcomeError that names the key, when the call's
//     deadline, its cancellation or the budget (MaxAttempts, MaxElapsed)
//     ends it after an attempt was sent, during an attempt or a pause.
//     Calling again with that key gets the answer without running twice.
//
// UNAVAILABLE, ABORTED, INTERNAL, UNKNOWN, RESOURCE_EXHAUSTED with a
// RetryInfo delay, and DEADLINE_EXCEEDED or CANCELLED that did not come
// from the call's own context are retried, after the status's RetryInfo
// delay when it is longer than the backoff. A header marked replayed
// followed by a transport failure is retried: the mark alone proves
// nothing about the answer.
func UnaryClientInterceptor(cfg ClientConfig) (grpc.UnaryClientInterceptor, error) {
	policy := protophase.ClientPolicy{MaxAttempts: cfg.MaxAttempts, MaxElapsed: cfg.MaxElapsed, BaseDelay: cfg.BaseDelay, MaxDelay: cfg.MaxDelay}
	if err := policy.Validate(); err != nil {
		return nil, fmt.Errorf("grpcphase: ClientConfig: %w", err)
	}
	cfg.KeyMetadata = strings.ToLower(cmp.Or(cfg.KeyMetadata, protophase.DefaultKeyMetadata))
	if cfg.Key == nil {
		cfg.Key = func(req any) string { return protophase.FieldKey(req, protophase.DefaultKeyFields) }
	}
	if cfg.NewKey == nil {
		cfg.NewKey = caller.NewKey
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if cfg.Keyed != nil && !cfg.Keyed(method) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		return cfg.call(ctx, policy, method, req, reply, cc, invoker, opts)
	}, nil
}

func (cfg *ClientConfig) call(ctx context.Context, policy protophase.ClientPolicy, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	key := ""
	if v := md.Get(cfg.KeyMetadata); len(v) > 0 {
		key = v[0]
	} else {
		if key = cfg.Key(req); key == "" {
			var err error
			if key, err = cfg.NewKey(); err != nil {
				return err
			}
		}
		ctx = metadata.AppendToOutgoingContext(ctx, cfg.KeyMetadata, key)
	}
	var header, trailer metadata.MD
	opts = append(opts[:len(opts):len(opts)], grpc.Header(&header), grpc.Trailer(&trailer))
	end := policy.Call(ctx, func(ctx context.Context) protophase.Attempt {
		header, trailer = nil, nil
		err := invoker(ctx, method, req, reply, cc, opts...)
		st := status.Convert(err)
		return protophase.Attempt{Err: err, Code: code.Code(st.Code()), Replayed: Replayed(trailer),
			Header: len(header) > 0, RetryDelay: retryDelay(st)}
	})
	switch {
	case end.Attempts == 0:
		return status.FromContextError(end.Err).Err()
	case end.Unknown != nil:
		return &UnknownOutcomeError{Method: method, Key: key, Attempts: end.Attempts, Cause: end.Unknown, Last: end.Err}
	}
	return end.Err
}

// retryDelay is the RetryInfo delay st carries, or zero.
func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}
