package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestRetryAfterRoundsUpWithinOneToFiveSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		left time.Duration
		want int
	}{{0, 1}, {-time.Second, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}, {4200 * time.Millisecond, 5}, {90 * time.Second, 5}} {
		if got := lockttl.RetryAfter(tc.left); got != tc.want {
			t.Errorf("RetryAfter(%v) = %d, want %d", tc.left, got, tc.want)
		}
	}
}

func acquire(t *testing.T, db keyrow.Querier, ttl time.Duration) *keyrow.Row {
	t.Helper()
	fp, _ := keyrow.Fingerprint("test", []byte(`{}`))
	out, row, err := keyrow.Acquire(context.Background(), db,
		keyrow.Request{Tenant: "acme", Key: "k1", Workflow: "test", Fingerprint: fp, Params: []byte(`{}`), TTL: ttl})
	if err != nil || !out.Acquiring() {
		t.Fatalf("acquire = %v, %v", out, err)
	}
	return row
}

func TestKeepRenewsALeaseThatOutlivesItsTTL(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	const ttl = 1200 * time.Millisecond
	row := acquire(t, db, ttl)
	lease := lockttl.New(row.ID, row.LockToken, ttl)

	work, stop := lease.Keep(context.Background(), db)
	// Work for two TTLs: without renewal another run could take over.
	time.Sleep(2 * ttl)
	fp, _ := keyrow.Fingerprint("test", []byte(`{}`))
	out, _, err := keyrow.Acquire(context.Background(), db,
		keyrow.Request{Tenant: "acme", Key: "k1", Workflow: "test", Fingerprint: fp, Params: []byte(`{}`), TTL: ttl})
	if err != nil || out != keyrow.Held {
		t.Fatalf("acquire while kept = %v, %v; want held", out, err)
	}
	if work.Err() != nil || lease.Err() != nil {
		t.Fatalf("lease reported lost while renewed: %v %v", work.Err(), lease.Err())
	}
	stop()
}

func TestKeepCancelsTheWorkWhenTheLeaseIsTakenOver(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	const ttl = 1200 * time.Millisecond
	row := acquire(t, db, ttl)
	lease := lockttl.New(row.ID, row.LockToken, ttl)
	work, stop := lease.Keep(context.Background(), db)
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
	case <-lease.Lost():
	default:
		t.Fatal("Lost not closed")
	}
	if !errors.Is(lease.Err(), keyrow.ErrLeaseLost) {
		t.Fatalf("lease.Err() = %v, want ErrLeaseLost", lease.Err())
	}
}
