package grpcphase_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/grpcphase"
	"github.com/atomicphase/atomicphase/grpcphase/internal/paytest"
	"github.com/atomicphase/atomicphase/protophase"
)

// scripted is a server whose Ping answers, attempt by attempt, what its
// script says, and which records each attempt's key and time.
type scripted struct {
	mu       sync.Mutex
	script   []func(ctx context.Context) error
	keys     []string
	at       []time.Time
	attempts int
}

func (s *scripted) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	s.mu.Lock()
	md, _ := metadata.FromIncomingContext(ctx)
	s.keys = append(s.keys, md.Get(protophase.DefaultKeyMetadata)...)
	s.at = append(s.at, time.Now())
	step := s.script[min(s.attempts, len(s.script)-1)]
	s.attempts++
	s.mu.Unlock()
	if err := step(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func startScripted(t *testing.T, cfg grpcphase.ClientConfig, script ...func(ctx context.Context) error) (*scripted, *grpc.ClientConn) {
	t.Helper()
	s := &scripted{script: script}
	return s, dial(t, serve(t, grpc.UnaryInterceptor(s.intercept)), cfg)
}

func fail(c codes.Code, retry time.Duration) func(context.Context) error {
	return func(context.Context) error {
		st := status.New(c, c.String())
		if retry > 0 {
			st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
		}
		return st.Err()
	}
}

func ok(context.Context) error { return nil }

func ping(ctx context.Context, conn *grpc.ClientConn) error {
	return conn.Invoke(ctx, paytest.Ping, paytest.Request(1, ""), new(structpb.Struct))
}

func TestTheClientKeepsOneKeyAndWaitsTheServersRetryDelay(t *testing.T) {
	t.Parallel()
	s, conn := startScripted(t, grpcphase.ClientConfig{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		fail(codes.Unavailable, 300*time.Millisecond), fail(codes.Aborted, 200*time.Millisecond), ok)
	if err := ping(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	if len(s.keys) != 3 || s.keys[0] == "" || s.keys[1] != s.keys[0] || s.keys[2] != s.keys[0] {
		t.Errorf("keys sent %q, want one key three times", s.keys)
	}
	for i, want := range []time.Duration{300 * time.Millisecond, 200 * time.Millisecond} {
		if got := s.at[i+1].Sub(s.at[i]); got < want {
			t.Errorf("retry %d after %v, want at least the RetryInfo delay %v", i+1, got, want)
		}
	}
}

func TestTheClientSendsTheCallersOwnKey(t *testing.T) {
	t.Parallel()
	s, conn := startScripted(t, grpcphase.ClientConfig{BaseDelay: time.Millisecond}, fail(codes.Unavailable, 0), ok)
	ctx := metadata.AppendToOutgoingContext(context.Background(), protophase.DefaultKeyMetadata, "mine")
	if err := ping(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if len(s.keys) != 2 || s.keys[0] != "mine" || s.keys[1] != "mine" {
		t.Errorf("keys sent %q, want mine twice", s.keys)
	}
}

func TestTheClientReturnsFinalAndReplayedAnswersAtOnce(t *testing.T) {
	t.Parallel()
	replayedInternal := func(ctx context.Context) error {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(protophase.ReplayedMetadata, "true"))
		return status.Error(codes.Internal, "stored")
	}
	for _, tc := range []struct {
		name     string
		script   []func(context.Context) error
		code     codes.Code
		attempts int
	}{
		{"reused key", []func(context.Context) error{fail(codes.FailedPrecondition, 0), ok}, codes.FailedPrecondition, 1},
		{"invalid argument", []func(context.Context) error{fail(codes.InvalidArgument, 0), ok}, codes.InvalidArgument, 1},
		{"replayed internal", []func(context.Context) error{replayedInternal, ok}, codes.Internal, 1},
		{"internal, then its replay", []func(context.Context) error{fail(codes.Internal, 0), replayedInternal, ok}, codes.Internal, 2},
		{"unknown, then OK", []func(context.Context) error{fail(codes.Unknown, 0), ok}, codes.OK, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, conn := startScripted(t, grpcphase.ClientConfig{BaseDelay: time.Millisecond}, tc.script...)
			err := ping(context.Background(), conn)
			if status.Code(err) != tc.code || s.attempts != tc.attempts {
				t.Errorf("%v after %d attempts, want %v after %d", err, s.attempts, tc.code, tc.attempts)
			}
		})
	}
}

func TestTheClientEndsWithAnUnknownOutcomeThatNamesTheKey(t *testing.T) {
	t.Parallel()
	t.Run("attempts", func(t *testing.T) {
		t.Parallel()
		s, conn := startScripted(t, grpcphase.ClientConfig{MaxAttempts: 3, BaseDelay: time.Millisecond}, fail(codes.Unavailable, 0))
		err := ping(context.Background(), conn)
		var unknown *grpcphase.UnknownOutcomeError
		if !errors.As(err, &unknown) || !errors.Is(err, grpcphase.ErrBudgetExhausted) || unknown.Attempts != 3 || unknown.Key != s.keys[0] {
			t.Fatalf("%v, want an unknown outcome after 3 attempts under key %s", err, s.keys[0])
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("status %v, want the last attempt's UNAVAILABLE", status.Code(err))
		}
	})
	t.Run("a delay past the budget", func(t *testing.T) {
		t.Parallel()
		s, conn := startScripted(t, grpcphase.ClientConfig{MaxElapsed: 500 * time.Millisecond}, fail(codes.Aborted, time.Minute))
		start := time.Now()
		err := ping(context.Background(), conn)
		if !errors.Is(err, grpcphase.ErrBudgetExhausted) || s.attempts != 1 || time.Since(start) > 400*time.Millisecond {
			t.Errorf("%v after %d attempts and %v; want the budget exhausted at once", err, s.attempts, time.Since(start))
		}
	})
}
