package store_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
)

func TestRetryAfterRoundsUpWithinOneToFiveSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		left time.Duration
		want time.Duration
	}{
		{0, time.Second}, {-time.Second, time.Second}, {time.Millisecond, time.Second}, {time.Second, time.Second},
		{1500 * time.Millisecond, 2 * time.Second}, {4200 * time.Millisecond, 5 * time.Second}, {90 * time.Second, 5 * time.Second},
	} {
		if got := lockttl.RetryAfter(tc.left); got != tc.want {
			t.Errorf("RetryAfter(%v) = %v, want %v", tc.left, got, tc.want)
		}
	}
}

// lease acquires the tenant acme's key with a lease of ttl and returns the
// row and its lease.
func lease(t *testing.T, db store.Querier, key string, ttl time.Duration) (*store.Row, *store.Lease) {
	t.Helper()
	req := request(t, "acme", key, `{}`)
	req.TTL = ttl
	out, row := acquire(t, db, req)
	if !out.Acquiring() {
		t.Fatalf("acquire %s = %v, want the lease", key, out)
	}
	return row, store.NewLease(row.Holder(), ttl)
}

// heldByAnother reports whether another request for the key finds it held.
func heldByAnother(t *testing.T, db store.Querier, key string) bool {
	t.Helper()
	out, _ := acquire(t, db, request(t, "acme", key, `{}`))
	return out == store.Held
}

func TestKeepRenewsALeaseThatOutlivesItsTTL(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	const ttl = 1200 * time.Millisecond
	_, l := lease(t, db, "k1", ttl)

	work, stop, err := l.Keep(context.Background(), db, 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// Work for two TTLs: without renewal another run could take over.
	time.Sleep(2 * ttl)
	if !heldByAnother(t, db, "k1") {
		t.Fatal("the key was free to take while its lease was kept")
	}
	if work.Err() != nil || l.Err() != nil {
		t.Fatalf("lease reported lost while renewed: %v %v", work.Err(), l.Err())
	}
}

func TestKeepCancelsTheWorkWhenTheLeaseIsTakenOver(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "it steals the lease with an UPDATE calling gen_random_uuid(), which Citus refuses")
	db := pgtest.Pool(t)
	const ttl = 1200 * time.Millisecond
	row, l := lease(t, db, "k1", ttl)
	work, stop, err := l.Keep(context.Background(), db, 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// An operator (or a takeover) replaces the token.
	if _, err := db.Exec(context.Background(), `UPDATE idempotency_keys SET lock_token = gen_random_uuid() WHERE id = $1`, row.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-work.Done():
	case <-time.After(5 * ttl):
		t.Fatal("work context not cancelled after the lease was lost")
	}
	select {
	case <-l.Lost():
	default:
		t.Fatal("Lost not closed")
	}
	if !errors.Is(l.Err(), keyrow.ErrLeaseLost) {
		t.Fatalf("lease.Err() = %v, want ErrLeaseLost", l.Err())
	}
}

func TestKeepWithAZeroOrTinyTTLRenewsWithoutPanicking(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	for _, d := range []time.Duration{0, time.Nanosecond} {
		if every := lockttl.RenewInterval(d); every <= 0 {
			t.Fatalf("RenewInterval(%v) = %v, want positive", d, every)
		}
	}
	for key, tiny := range map[string]time.Duration{"zero": 0, "tiny": time.Nanosecond} {
		row, _ := lease(t, db, key, ttl)
		l := store.NewLease(row.Holder(), tiny)
		if l.TTL < lockttl.MinTTL {
			t.Fatalf("NewLease with TTL %v kept %v, want at least %v", tiny, l.TTL, lockttl.MinTTL)
		}
		work, stop, err := l.Keep(context.Background(), db, 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(lockttl.MinTTL + lockttl.MinTTL/2)
		if !heldByAnother(t, db, key) || work.Err() != nil {
			t.Fatalf("%s TTL: the kept lease lapsed (work %v)", key, work.Err())
		}
		stop()
		stop()
		if work.Err() == nil {
			t.Fatalf("%s TTL: work context still live after stop", key)
		}
	}
}

func TestKeepOnATakenOverLeaseFailsAtOnceAndStartsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, counter := pgtest.CountingPool(t, nil)
	const ttl = 1200 * time.Millisecond
	_, stale := lease(t, db, "k1", ttl)
	// The holder stalls; an operator frees the key and another run takes it.
	if freed, err := store.Unlock(ctx, db, "acme", "k1", nil); err != nil || !freed {
		t.Fatalf("unlock = %v, %v", freed, err)
	}
	taker, _ := lease(t, db, "k1", ttl)

	counter.Reset()
	work, stop, err := stale.Keep(ctx, db, 0, "", "")
	if !errors.Is(err, keyrow.ErrLeaseLost) || work != nil || stop != nil {
		t.Fatalf("Keep of a taken-over lease = %v, %v, %v; want ErrLeaseLost and nothing to stop", work, stop != nil, err)
	}
	select {
	case <-stale.Lost():
	default:
		t.Fatal("Lost not closed")
	}
	// Nothing renews in the background: after several renewal intervals the
	// only statement sent is Keep's own first renewal.
	time.Sleep(3 * lockttl.RenewInterval(ttl))
	if n := counter.Statements(); n != 1 {
		t.Fatalf("%d statements after the failed Keep, want 1: %q", n, counter.SQL())
	}
	if _, err := store.Renew(ctx, db, taker.Holder(), ttl); err != nil {
		t.Fatalf("the new holder's lease: %v", err)
	}
}

// TestKeepTakesAFreshProofAndRenewsAfterAStall: work that starts at once
// after the statement that took (or renewed) the lease needs no statement
// of its own to prove the lease; a holder that stalled longer than
// ProofWindow since then renews first, and finds the key taken over.
func TestKeepTakesAFreshProofAndRenewsAfterAStall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, counter := pgtest.CountingPool(t, nil)
	const ttl = 3 * time.Second
	if w := store.ProofWindow(ttl); w != time.Second {
		t.Fatalf("ProofWindow(%v) = %v, want a second", ttl, w)
	}
	if w := store.ProofWindow(lockttl.MinTTL); w != lockttl.RenewInterval(lockttl.MinTTL) {
		t.Fatalf("ProofWindow(%v) = %v, want the renewal interval %v", lockttl.MinTTL, w, lockttl.RenewInterval(lockttl.MinTTL))
	}

	row, fresh := lease(t, db, "fresh", ttl)
	if row.TakenAt.IsZero() || time.Since(row.TakenAt) > time.Minute {
		t.Fatalf("Acquire's TakenAt = %v, want when it sent the statement", row.TakenAt)
	}
	fresh.Proven(row.TakenAt)
	counter.Reset()
	_, stop, err := fresh.Keep(ctx, db, 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if n := counter.Statements(); n != 0 {
		t.Fatalf("Keep right after the lease was taken sent %d statements, want none: %q", n, counter.SQL())
	}

	// A proof older than the window does not count: the holder renews,
	// and a holder whose key was taken over meanwhile starts nothing.
	_, stale := lease(t, db, "stale", ttl)
	stale.Proven(time.Now().Add(-store.ProofWindow(ttl)))
	if freed, err := store.Unlock(ctx, db, "acme", "stale", nil); err != nil || !freed {
		t.Fatalf("unlock = %v, %v", freed, err)
	}
	lease(t, db, "stale", ttl)
	counter.Reset()
	if _, _, err := stale.Keep(ctx, db, 0, "", ""); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("Keep after a stall, the key taken over = %v, want ErrLeaseLost", err)
	}
	if n := counter.Statements(); n != 1 {
		t.Fatalf("Keep after a stall sent %d statements, want its renewal: %q", n, counter.SQL())
	}

	// A lease never proven renews too.
	_, unproven := lease(t, db, "unproven", ttl)
	counter.Reset()
	_, stop, err = unproven.Keep(ctx, db, 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if n := counter.Statements(); n != 1 {
		t.Fatalf("Keep of a lease never proven sent %d statements, want its renewal: %q", n, counter.SQL())
	}
}

// TestKeepRenewsAnIntervalAfterTheProof: when Keep starts on a fresh proof,
// its first renewal comes one renewal interval after that proof, not after
// Keep, so the lease is renewed as often as when Keep renews first.
func TestKeepRenewsAnIntervalAfterTheProof(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, counter := pgtest.CountingPool(t, nil)
	const ttl = 6 * time.Second // a renewal every 2 s; proofs count for 1 s
	_, l := lease(t, db, "k1", ttl)
	proof := time.Now()
	l.Proven(proof)
	time.Sleep(900 * time.Millisecond)
	counter.Reset()
	_, stop, err := l.Keep(ctx, db, 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// Due at proof+2s; timed from Keep it would come at proof+2.9s.
	for counter.Statements() == 0 && time.Since(proof) < 5*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if at := time.Since(proof); at < 2*time.Second || at > 2600*time.Millisecond {
		t.Fatalf("first renewal %v after the proof, want 2s (one renewal interval)", at.Round(time.Millisecond))
	}
}

// TestKeepStartsNoGoroutineUntilARenewalIsDue: a foreign call that starts
// right after the commit that proved the lease, and returns before the
// lease needs renewing, as most calls do, costs no goroutine: the renewals
// are a timer until the first is due.
func TestKeepStartsNoGoroutineUntilARenewalIsDue(t *testing.T) {
	l := store.NewLease(store.Holder{Tenant: "acme", ID: uuid.New(), Token: uuid.New()}, 30*time.Second)
	grew := 0
	// Other goroutines of the process may start or end meanwhile; one try
	// in which the count did not grow shows Keep started none.
	for range 10 {
		l.Proven(time.Now())
		before := runtime.NumGoroutine()
		work, stop, err := l.Keep(context.Background(), nil, time.Minute, "", "")
		if err != nil {
			t.Fatal(err)
		}
		grew = runtime.NumGoroutine() - before
		stop()
		if work.Err() == nil {
			t.Fatal("the work's context is live after stop")
		}
		if grew <= 0 {
			return
		}
	}
	t.Fatalf("Keep on a fresh proof started %d goroutine(s), want none", grew)
}

// BenchmarkKeepRightAfterACommit measures Keep and stop around a foreign
// call that needs no renewal: the usual call, made right after the commit
// that proved the lease.
func BenchmarkKeepRightAfterACommit(b *testing.B) {
	l := store.NewLease(store.Holder{Tenant: "acme", ID: uuid.New(), Token: uuid.New()}, 30*time.Second)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l.Proven(time.Now())
		_, stop, err := l.Keep(ctx, nil, time.Minute, "", "")
		if err != nil {
			b.Fatal(err)
		}
		stop()
	}
}
