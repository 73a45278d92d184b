package consume_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/consume"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
	"github.com/atomicphase/atomicphase/phase"
)

// TestAMessageThatCannotBeReadIsDroppedOnlyWhenItCanNeverSucceed: an id,
// tenant or payload that cannot be read because a lookup's store is down,
// the consumer is stopping or the reading code panicked is retried; a
// malformed payload or a refused tenant is dropped.
func TestAMessageThatCannotBeReadIsDroppedOnlyWhenItCanNeverSucceed(t *testing.T) {
	t.Parallel()
	malformed := json.Unmarshal([]byte(`{"amount":`), &struct{}{})
	if malformed == nil {
		t.Fatal("the malformed payload decoded")
	}
	for _, tc := range []struct {
		name string
		err  error
		want consume.Action
	}{
		{"lookup store down", fmt.Errorf("supplier lookup: %w: connection refused", phase.ErrUnavailable), consume.Retry},
		{"consumer stopping", fmt.Errorf("decode: %w", context.Canceled), consume.Retry},
		{"lookup timed out", fmt.Errorf("tenant: %w", context.DeadlineExceeded), consume.Retry},
		{"panic", &phase.PanicError{Where: "Decode", Value: "nil map"}, consume.Retry},
		{"malformed payload", fmt.Errorf("decode: %w", malformed), consume.Drop},
		{"refused tenant", &phase.RequestError{Status: 401, Detail: "unknown merchant"}, consume.Drop},
		{"invalid tenant", fmt.Errorf("tenant: %w", keyrow.ErrInvalidTenant), consume.Drop},
	} {
		v := consume.ReadFailed(tc.err)
		if v.Action != tc.want || !errors.Is(v.Err, tc.err) {
			t.Errorf("%s: %v %v, want %v with the error", tc.name, v.Action, v.Err, tc.want)
		}
		if v.Action == consume.Retry && v.Delay < consume.DefaultRetryDelay {
			t.Errorf("%s: retried after %v, want at least %v", tc.name, v.Delay, consume.DefaultRetryDelay)
		}
	}
}

// TestBackoffDoublesUpToTheCapWithJitterAndKeepsTheRunsDelay checks the
// pause before each delivery, over many draws: the doubling step less at
// most a quarter, never past MaxRetryDelay, never below the run's Delay.
func TestBackoffDoublesUpToTheCapWithJitterAndKeepsTheRunsDelay(t *testing.T) {
	t.Parallel()
	failed := consume.Verdict{Action: consume.Retry, Delay: consume.DefaultRetryDelay}
	for attempt := -1; attempt <= 40; attempt++ {
		step := consume.MaxRetryDelay
		if attempt < 10 {
			step = min(consume.DefaultRetryDelay<<max(attempt-1, 0), consume.MaxRetryDelay)
		}
		lo, hi := max(step*3/4, failed.Delay), step
		seen := map[time.Duration]bool{}
		for range 200 {
			d := failed.Backoff(attempt)
			if d < lo || d > hi {
				t.Fatalf("attempt %d: %v, want between %v and %v", attempt, d, lo, hi)
			}
			seen[d] = true
		}
		if attempt >= 3 && len(seen) < 10 {
			t.Errorf("attempt %d: %d distinct pauses in 200, want jitter", attempt, len(seen))
		}
	}
	inFlight := consume.Verdict{Action: consume.Retry, Delay: 4 * time.Second}
	if d := inFlight.Backoff(1); d != 4*time.Second {
		t.Errorf("a key whose lease has 4 s left: %v at the first delivery, want 4s", d)
	}
	long := consume.Verdict{Action: consume.Retry, Delay: 2 * consume.MaxRetryDelay}
	if d := long.Backoff(30); d != long.Delay {
		t.Errorf("a run asking for %v: %v, want what it asked", long.Delay, d)
	}
}

// TestARunThatCannotSucceedYetIsRetried: a run on a store that is gone,
// a run of a workflow this deploy does not register (the next deploy may)
// and a run whose provider asks to be called again later are retried, not
// dropped, the last no sooner than the provider asked; the message id
// reused with another payload is dropped.
func TestARunThatCannotSucceedYetIsRetried(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	type payout struct{ Cents int }
	calls := 0
	newWorkflow := func(name string) *phase.Workflow[payout, struct{}] {
		w, err := phase.NewWorkflow(name,
			phase.Local("paid", func(ctx context.Context, tx pgx.Tx, in *phase.Input[payout, struct{}]) (phase.Result, error) {
				calls++
				return phase.JSON(200, "paid"), nil
			}))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	registered, other := newWorkflow("payouts"), newWorkflow("refunds")
	throttled, err := phase.NewWorkflow("transfers",
		phase.Foreign("sent",
			func(ctx context.Context, in *phase.Input[payout, struct{}]) (string, error) {
				return "", fmt.Errorf("bank: %w", rateLimited(7*time.Second))
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[payout, struct{}], id string) (phase.Result, error) {
				return phase.JSON(200, id), nil
			}).Repeatable())
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t)
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	client, err := phase.NewClient(pool, &phase.Config{Logger: logger}, registered, throttled)
	if err != nil {
		t.Fatal(err)
	}
	v := consume.Run(ctx, client, throttled, "billing", "msg-3", payout{100})
	if v.Action != consume.Retry || v.Delay != 7*time.Second || v.Backoff(1) != 7*time.Second || v.Backoff(4) < 7*time.Second {
		t.Errorf("provider asking for 7 s: %v after %v (backoff %v at the first delivery), want a retry after 7 s", v.Action, v.Delay, v.Backoff(1))
	}
	if v := consume.Run(ctx, client, other, "billing", "msg-1", payout{100}); v.Action != consume.Retry || !errors.Is(v.Err, phase.ErrNotRegistered) {
		t.Errorf("unregistered workflow: %v %v, want a retry", v.Action, v.Err)
	}
	if v := consume.Run(ctx, client, registered, "billing", "msg-1", payout{100}); v.Action != consume.Ack {
		t.Fatalf("first run: %v %v, want ack", v.Action, v.Err)
	}
	if v := consume.Run(ctx, client, registered, "billing", "msg-1", payout{200}); v.Action != consume.Drop || !errors.Is(v.Err, consume.ErrReused) {
		t.Errorf("another payload: %v %v, want a drop", v.Action, v.Err)
	}

	gone, err := pgxpool.New(ctx, pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	goneClient, err := phase.NewClient(gone, &phase.Config{Logger: logger}, registered)
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	if v := consume.Run(ctx, goneClient, registered, "billing", "msg-2", payout{100}); v.Action != consume.Retry || !errors.Is(v.Err, phase.ErrUnavailable) {
		t.Errorf("store gone: %v %v, want a retry", v.Action, v.Err)
	}
	if calls != 1 {
		t.Errorf("the workflow paid %d times, want once", calls)
	}
}

// rateLimited is a provider's refusal that says when to call again, as a
// Retry-After header does.
type rateLimited time.Duration

func (r rateLimited) Error() string             { return "rate limited" }
func (r rateLimited) RetryAfter() time.Duration { return time.Duration(r) }

// TestAMessageWhoseKeyIsInFlightWaitsForTheWholeLease: a run killed with
// its key's 20 s lease (lockttl.DefaultTTL) leaves the key in flight; the
// message's next delivery is retried after the lease's time left, not
// after the 5 s an HTTP Retry-After is capped at, so that a consumer does
// not spend its deliveries on a holder that died.
func TestAMessageWhoseKeyIsInFlightWaitsForTheWholeLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	type payout struct{ Cents int }
	w, err := phase.NewWorkflow("payouts",
		phase.Local("paid", func(ctx context.Context, tx pgx.Tx, in *phase.Input[payout, struct{}]) (phase.Result, error) {
			return phase.JSON(200, "paid"), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	client, err := phase.NewClient(pgtest.Pool(t), &phase.Config{Logger: logger}, w)
	if err != nil {
		t.Fatal(err)
	}
	killed := phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "paid", Stage: phase.BeforeCommit}))
	if _, err := w.Run(killed, client, "billing", "msg-4", payout{100}); !errors.Is(err, phase.ErrCrash) {
		t.Fatalf("the killed run: %v, want phase.ErrCrash", err)
	}
	v := consume.Run(ctx, client, w, "billing", "msg-4", payout{100})
	if v.Action != consume.Retry || v.Outcome == nil || v.Outcome.Kind != phase.OutcomeInFlight {
		t.Fatalf("delivery while the key is held: %v %+v, want a retry of a key in flight", v.Action, v.Outcome)
	}
	if v.Delay < 15*time.Second || v.Delay > lockttl.DefaultTTL {
		t.Errorf("retried after %v, want the lease's time left, about %v", v.Delay, lockttl.DefaultTTL)
	}
}
