package grpcphase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
// used up ClientConfig.MaxAttempts or ClientConfig.MaxElapsed.
var ErrBudgetExhausted = errors.New("grpcphase: retry budget exhausted")

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
// outgoing context, or a new one) and retries it under that key until it
// has an answer the server will not change:
//
//   - an answer marked replayed (Replayed), whatever its code, is returned;
//   - OK and every code below not retried are returned;
//   - UNAVAILABLE (the server, or its key store, is down; the transport
//     failed), ABORTED (the key's first call is in flight or on hold),
//     RESOURCE_EXHAUSTED, INTERNAL and UNKNOWN (a failed run stores
//     nothing: the retry resumes it), and DEADLINE_EXCEEDED while the
//     call's own context has time left, are retried after the status's
//     RetryInfo delay, or the backoff when it is longer or there is none;
//   - a pause that would end past MaxElapsed or the context's deadline,
//     or the last attempt's failure, ends the call with an
//     *UnknownOutcomeError that names the key.
func UnaryClientInterceptor(cfg ClientConfig) (grpc.UnaryClientInterceptor, error) {
	if cfg.MaxAttempts < 0 || cfg.BaseDelay < 0 || cfg.MaxDelay < 0 || cfg.MaxElapsed < -1 {
		return nil, errors.New("grpcphase: ClientConfig.MaxAttempts, BaseDelay and MaxDelay must not be negative, nor MaxElapsed below -1")
	}
	cfg.KeyMetadata = strings.ToLower(cmp.Or(cfg.KeyMetadata, protophase.DefaultKeyMetadata))
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, caller.DefaultMaxAttempts)
	cfg.MaxElapsed = cmp.Or(cfg.MaxElapsed, caller.DefaultMaxElapsed)
	cfg.BaseDelay = cmp.Or(cfg.BaseDelay, caller.DefaultBaseDelay)
	cfg.MaxDelay = cmp.Or(cfg.MaxDelay, caller.DefaultMaxDelay)
	if cfg.NewKey == nil {
		cfg.NewKey = caller.NewKey
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if cfg.Keyed != nil && !cfg.Keyed(method) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		return cfg.call(ctx, method, req, reply, cc, invoker, opts)
	}, nil
}

func (cfg *ClientConfig) call(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	key := ""
	if v := md.Get(cfg.KeyMetadata); len(v) > 0 {
		key = v[0]
	} else {
		var err error
		if key, err = cfg.NewKey(); err != nil {
			return err
		}
		ctx = metadata.AppendToOutgoingContext(ctx, cfg.KeyMetadata, key)
	}
	if cfg.MaxElapsed > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, cfg.MaxElapsed, ErrBudgetExhausted)
		defer cancel()
	}
	var header, trailer metadata.MD
	opts = append(opts[:len(opts):len(opts)], grpc.Header(&header), grpc.Trailer(&trailer))
	for attempt := 1; ; attempt++ {
		header, trailer = nil, nil
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || Replayed(header) || Replayed(trailer) || !retried(ctx, err) {
			return err
		}
		unknown := &UnknownOutcomeError{Method: method, Key: key, Attempts: attempt, Cause: ErrBudgetExhausted, Last: err}
		if ctx.Err() != nil {
			unknown.Cause = context.Cause(ctx)
			return unknown
		}
		if attempt >= cfg.MaxAttempts {
			return unknown
		}
		pause := max(cfg.backoff(attempt), retryDelay(err))
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < pause {
			// Sleeping past the deadline would only end the call later.
			if c := context.Cause(ctx); c != nil {
				unknown.Cause = c
			}
			return unknown
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			unknown.Cause = context.Cause(ctx)
			return unknown
		case <-t.C:
		}
	}
}

// retried reports whether a call that failed with err is sent again.
func retried(ctx context.Context, err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.ResourceExhausted, codes.Internal, codes.Unknown:
		return true
	case codes.DeadlineExceeded, codes.Canceled:
		// The server's deadline, or a proxy's, not the call's own.
		return ctx.Err() == nil
	}
	return false
}

// retryDelay is the RetryInfo delay err's status carries, or zero.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// backoff is the full-jitter pause before the retry that follows attempt n.
func (cfg *ClientConfig) backoff(n int) time.Duration {
	ceiling := cfg.MaxDelay
	if shift := n - 1; shift < 32 && cfg.BaseDelay<<shift < ceiling && cfg.BaseDelay<<shift > 0 {
		ceiling = cfg.BaseDelay << shift
	}
	return rand.N(ceiling + 1)
}
