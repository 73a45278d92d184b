package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// rowRules selects the rows that break a rule of the key row: the rules the
// table's CHECK constraints stated before migration 003, and one more (a
// finished key has no lease).
const rowRules = `
SELECT tenant || '/' || idempotency_key || ': ' || concat_ws(', ',
    CASE WHEN char_length(tenant) NOT BETWEEN 1 AND 255 THEN 'tenant length' END,
    CASE WHEN char_length(idempotency_key) NOT BETWEEN 1 AND 255 THEN 'key length' END,
    CASE WHEN char_length(workflow) NOT BETWEEN 1 AND 100 THEN 'workflow length' END,
    CASE WHEN octet_length(request_fingerprint) <> 32 THEN 'fingerprint length' END,
    CASE WHEN char_length(recovery_point) NOT BETWEEN 1 AND 100 THEN 'recovery point length' END,
    CASE WHEN hold NOT IN ('unknown', 'dead') THEN 'hold' END,
    CASE WHEN response_status NOT BETWEEN 100 AND 599 THEN 'status' END,
    CASE WHEN (lock_token IS NULL) <> (lock_expires_at IS NULL) THEN 'lease without token or expiry' END,
    CASE WHEN (recovery_point = 'finished') <> (finished_at IS NOT NULL AND response_status IS NOT NULL)
         THEN 'finished without finish time or response' END,
    CASE WHEN finished_at IS NOT NULL AND lock_token IS NOT NULL THEN 'finished with a lease' END)
FROM idempotency_keys
WHERE NOT (char_length(tenant) BETWEEN 1 AND 255
       AND char_length(idempotency_key) BETWEEN 1 AND 255
       AND char_length(workflow) BETWEEN 1 AND 100
       AND octet_length(request_fingerprint) = 32
       AND char_length(recovery_point) BETWEEN 1 AND 100
       AND coalesce(hold IN ('unknown', 'dead'), true)
       AND coalesce(response_status BETWEEN 100 AND 599, true)
       AND (lock_token IS NULL) = (lock_expires_at IS NULL)
       AND (recovery_point = 'finished') = (finished_at IS NOT NULL AND response_status IS NOT NULL)
       AND NOT (finished_at IS NOT NULL AND lock_token IS NOT NULL))`

func brokenRows(t *testing.T, db store.Querier) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), rowRules)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var broken []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		broken = append(broken, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return broken
}

// TestMalformedValuesNeverReachTheTable sends every value a CHECK
// constraint used to refuse through the store, and checks that each write
// is refused before it reaches the table.
func TestMalformedValuesNeverReachTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	long := func(n int) string { return strings.Repeat("é", n) }
	for _, tc := range []struct {
		name string
		edit func(*store.Request)
	}{
		{"empty tenant", func(r *store.Request) { r.Tenant = "" }},
		{"tenant of 256 characters", func(r *store.Request) { r.Tenant = long(256) }},
		{"tenant with a NUL", func(r *store.Request) { r.Tenant = "a\x00b" }},
		{"empty key", func(r *store.Request) { r.Key = "" }},
		{"key of 256 characters", func(r *store.Request) { r.Key = long(256) }},
		{"key of invalid UTF-8", func(r *store.Request) { r.Key = "\xff" }},
		{"empty workflow", func(r *store.Request) { r.Workflow = "" }},
		{"workflow of 101 characters", func(r *store.Request) { r.Workflow = long(101) }},
		{"no lease TTL", func(r *store.Request) { r.TTL = 0 }},
	} {
		req := request(t, "acme", "k1", `{}`)
		tc.edit(&req)
		if _, _, err := store.Acquire(ctx, db, req); err == nil {
			t.Errorf("acquire with %s succeeded", tc.name)
		}
	}
	// The longest valid values are stored.
	req := request(t, long(255), long(255), `{}`)
	req.Workflow = long(100)
	if out, _ := acquire(t, db, req); out != store.New {
		t.Fatalf("acquire with the longest valid values = %v", out)
	}

	_, row := acquire(t, db, request(t, "acme", "k1", `{}`))
	for _, point := range []string{"", keyrow.Started, keyrow.Finished, long(101), "a\x00"} {
		if err := store.Advance(ctx, db, row.Holder(), point, nil, ttl); err == nil {
			t.Errorf("advance to %q succeeded", point)
		}
	}
	if err := store.Advance(ctx, db, row.Holder(), "charged", nil, 0); err == nil {
		t.Error("advance with no lease TTL succeeded")
	}
	if _, err := store.Renew(ctx, db, row.Holder(), -time.Second); err == nil {
		t.Error("renew with a negative TTL succeeded")
	}
	for _, status := range []int{0, 99, 600} {
		if err := store.Finish(ctx, db, row.Holder(), nil, keyrow.Response{Status: status}); err == nil {
			t.Errorf("finish with status %d succeeded", status)
		}
	}
	if err := store.Release(ctx, db, row.Holder(), "", "parked", store.EndedIdle, false); err == nil {
		t.Error("release with an unknown hold succeeded")
	}
	if got := read(t, db, "acme", "k1"); got.RecoveryPoint != keyrow.Started || got.Status != nil || got.Token == nil || *got.Token != row.LockToken {
		t.Fatalf("a refused write changed the row: %+v", got)
	}
	if broken := brokenRows(t, db); len(broken) != 0 {
		t.Fatalf("rows breaking the rules: %q", broken)
	}
}

// TestAHolderOfAKeyClosedAsAbandonedCannotWriteToIt pauses a holder past
// the retention, lets the reaper close its key, and checks that the holder's
// writes are fenced off the finished key.
func TestAHolderOfAKeyClosedAsAbandonedCannotWriteToIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	_, row := acquire(t, db, request(t, "acme", "k1", `{}`))
	age(t, db, "acme", "k1", "lock_expires_at = now() - interval '1 second', last_run_at = now() - interval '2 days', created_at = now() - interval '2 days'")
	if n, err := store.Expire(ctx, db, "", 24*time.Hour, 10, pgtest.OnCitus()); err != nil || n != 1 {
		t.Fatalf("expire = %d, %v; want the key closed", n, err)
	}
	if got := read(t, db, "acme", "k1"); got.Token != nil {
		t.Fatalf("the closed key kept the lease of token %v", got.Token)
	}
	// A key closed by a release that kept the expired lease, as releases
	// before migration 003 did.
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET lock_token = $1, lock_expires_at = now() - interval '1 second'`, row.LockToken); err != nil {
		t.Fatal(err)
	}
	timePassed(t, db)
	for name, write := range map[string]func() error{
		"advance": func() error { return store.Advance(ctx, db, row.Holder(), "charged", nil, ttl) },
		"finish": func() error {
			return store.Finish(ctx, db, row.Holder(), nil, keyrow.Response{Status: 201})
		},
		"release": func() error { return store.Release(ctx, db, row.Holder(), "late", "", store.EndedIdle, false) },
		"renew": func() error {
			_, err := store.Renew(ctx, db, row.Holder(), ttl)
			return err
		},
	} {
		if err := write(); !errors.Is(err, keyrow.ErrLeaseLost) {
			t.Errorf("%s by the paused holder = %v, want ErrLeaseLost", name, err)
		}
	}
	if got := read(t, db, "acme", "k1"); got.RecoveryPoint != keyrow.Finished || got.Status == nil || *got.Status != 500 {
		t.Fatalf("the closed key changed: %+v", got)
	}
}

// TestEveryStoreWriteKeepsTheRowRules runs a long random sequence of every
// write the store makes, by current and stale holders, the completer, the
// reaper and operators, over a few keys, with leases and retention timing
// out at random, and checks the row rules after every step.
func TestEveryStoreWriteKeepsTheRowRules(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "its clock steps move time with an UPDATE that Citus refuses (a stable function of a column); the store's writes are tested on Citus by citus_test.go")
	ctx := context.Background()
	db := pgtest.Pool(t)
	seed := uint64(time.Now().UnixNano())
	rnd := rand.New(rand.NewPCG(seed, 3))
	keys := []string{"k1", "k2", "k3", "k4"}
	var holders []store.Holder // every lease ever taken, current or stale
	pick := func() store.Holder {
		if len(holders) == 0 {
			return store.Holder{Tenant: "acme", ID: uuid.New(), Token: uuid.New()}
		}
		return holders[rnd.IntN(len(holders))]
	}
	resp := keyrow.Response{Status: 201, Body: []byte(`{}`)}
	holds := []keyrow.Hold{"", keyrow.HoldUnknown, keyrow.HoldDead}
	steps := []struct {
		name string
		do   func() error
	}{
		{"acquire", func() error {
			body := `{}`
			if rnd.IntN(8) == 0 {
				body = `{"other":1}`
			}
			out, row, err := store.Acquire(ctx, db, request(t, "acme", keys[rnd.IntN(len(keys))], body))
			if err == nil && out.Acquiring() {
				holders = append(holders, row.Holder())
			}
			return err
		}},
		{"advance", func() error {
			h := pick()
			return store.Advance(ctx, db, h, fmt.Sprintf("phase_%d", rnd.IntN(3)), []byte(`{"n":1}`), ttl)
		}},
		{"finish", func() error { h := pick(); return store.Finish(ctx, db, h, nil, resp) }},
		{"release", func() error {
			h := pick()
			return store.Release(ctx, db, h, "failed", holds[rnd.IntN(len(holds))], store.Ending(rnd.IntN(3)), false)
		}},
		{"renew", func() error { h := pick(); _, err := store.Renew(ctx, db, h, ttl); return err }},
		{"unlock", func() error { _, err := store.Unlock(ctx, db, "acme", keys[rnd.IntN(len(keys))], nil); return err }},
		{"retry", func() error { return store.Retry(ctx, db, "acme", keys[rnd.IntN(len(keys))], nil) }},
		{"claim", func() error {
			rows, err := store.Claim(ctx, db, store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 2, StuckAfter: 0, TTL: ttl})
			for _, r := range rows {
				holders = append(holders, r.Holder())
			}
			return err
		}},
		{"bury", func() error { _, err := store.Bury(ctx, db, []string{"test"}, nil, 1, 0); return err }},
		{"expire", func() error { _, err := store.Expire(ctx, db, "", time.Hour, 2, pgtest.OnCitus()); return err }},
		{"reap", func() error { _, err := store.Reap(ctx, db, "test", time.Hour, 2, pgtest.OnCitus()); return err }},
		{"time passes", func() error {
			_, err := db.Exec(ctx, `UPDATE idempotency_keys SET lock_expires_at = lock_expires_at - interval '1 minute',
				last_run_at = last_run_at - interval '2 hours', finished_at = finished_at - interval '2 hours'
				WHERE idempotency_key = $1`, keys[rnd.IntN(len(keys))])
			return err
		}},
	}
	for i := range 400 {
		step := steps[rnd.IntN(len(steps))]
		err := step.do()
		if err != nil && !errors.Is(err, keyrow.ErrLeaseLost) && !errors.Is(err, keyrow.ErrNotFound) && !errors.Is(err, keyrow.ErrNotHeld) {
			t.Fatalf("seed %d, step %d (%s): %v", seed, i, step.name, err)
		}
		if broken := brokenRows(t, db); len(broken) != 0 {
			t.Fatalf("seed %d, step %d (%s) broke the row rules: %q", seed, i, step.name, broken)
		}
	}
}
