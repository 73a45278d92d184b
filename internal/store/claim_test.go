package store_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// fail runs the key n times and ends each run with a failure, as the
// completer's own runs (store.EndedFailed) or a client's retries
// (store.EndedIdle).
func fail(t *testing.T, db store.Querier, tenant, key string, n int, end store.Ending) {
	t.Helper()
	for range n {
		out, row := acquire(t, db, request(t, tenant, key, `{"amount":100}`))
		if !out.Acquiring() {
			t.Fatalf("acquire %s/%s = %v, want the lease", tenant, key, out)
		}
		if err := store.Release(context.Background(), db, row.Holder(), "provider down", "", end, false); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFailuresCountTheCompletersRunsAndResetOnProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	failures := func(want int, after string) {
		t.Helper()
		if got := inspect(t, db, "acme", "k1").Failures; got != want {
			t.Fatalf("failures after %s = %d, want %d", after, got, want)
		}
	}

	fail(t, db, "acme", "k1", 2, store.EndedFailed)
	failures(2, "two completer failures")
	fail(t, db, "acme", "k1", 3, store.EndedIdle)
	failures(2, "three client failures")

	_, row := acquire(t, db, request(t, "acme", "k1", `{"amount":100}`))
	if err := store.Advance(ctx, db, row.Holder(), "charged", nil, ttl); err != nil {
		t.Fatal(err)
	}
	failures(0, "a committed phase")
	if err := store.Release(ctx, db, row.Holder(), "provider down", "", store.EndedFailed, false); err != nil {
		t.Fatal(err)
	}
	failures(1, "a completer failure")

	_, row = acquire(t, db, request(t, "acme", "k1", `{"amount":100}`))
	if err := store.Finish(ctx, db, row.Holder(), nil, keyrow.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	failures(0, "finishing")
	if got := inspect(t, db, "acme", "k1").Attempts; got != 7 {
		t.Fatalf("attempts = %d, want 7: every run counts", got)
	}
}

func TestBuryGivesUpOnlyOnIdleKeysTheCompleterFailedEnough(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	const maxFailures = 3
	fail(t, db, "acme", "abandoned", maxFailures, store.EndedFailed)
	fail(t, db, "acme", "abandoned-more", maxFailures+2, store.EndedFailed)
	fail(t, db, "acme", "recent", maxFailures, store.EndedFailed)
	fail(t, db, "acme", "client-retried", 10, store.EndedIdle)
	fail(t, db, "acme", "almost", maxFailures-1, store.EndedFailed)
	fail(t, db, "acme", "leased", maxFailures, store.EndedFailed)
	acquire(t, db, request(t, "acme", "leased", `{"amount":100}`))
	for _, key := range []string{"abandoned", "abandoned-more", "client-retried", "almost", "leased"} {
		age(t, db, "acme", key, "last_run_at = now() - interval '1 hour'")
	}
	// The key of a workflow this process does not run is judged by one that
	// does.
	other := request(t, "acme", "other", `{}`)
	other.Workflow = "other"
	_, row := acquire(t, db, other)
	if err := store.Release(ctx, db, row.Holder(), "provider down", "", store.EndedFailed, false); err != nil {
		t.Fatal(err)
	}
	age(t, db, "acme", "other", "failures = 10, last_run_at = now() - interval '1 hour'")

	if n, err := store.Bury(ctx, db, nil, nil, maxFailures, time.Minute); err != nil || n != 0 {
		t.Fatalf("bury with no workflows = %d, %v; want none", n, err)
	}
	n, err := store.Bury(ctx, db, []string{"test"}, nil, maxFailures, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := store.List(ctx, db, keyrow.ListFilter{Status: keyrow.StatusDead})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keysOf(dead.Keys), []string{"abandoned", "abandoned-more"}; n != 2 || !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		t.Fatalf("bury moved %d keys, dead are %q; want %q", n, got, want)
	}
	if info := inspect(t, db, "acme", "client-retried"); info.Hold != "" || info.Attempts != 10 || info.Failures != 0 {
		t.Fatalf("client-retried key: hold %q, attempts %d, failures %d; want runnable after 10 attempts, 0 failures",
			info.Hold, info.Attempts, info.Failures)
	}
	for _, key := range []string{"recent", "almost", "leased", "other"} {
		if hold := inspect(t, db, "acme", key).Hold; hold != "" {
			t.Errorf("%s key was buried", key)
		}
	}
}

func TestClaimTakesOnlyDueKeysOfTheGivenWorkflows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	for key, state := range map[string]string{
		"runnable": "runnable", "unknown": "unknown", "dead": "dead", "leased": "leased", "finished": "finished",
		"young": "runnable",
	} {
		keyIn(t, db, "acme", key, state)
		if key != "young" {
			age(t, db, "acme", key, "last_run_at = now() - interval '1 hour'")
		}
	}
	for _, key := range []string{"billing-1", "billing-2"} {
		req := request(t, "acme", key, `{}`)
		req.Workflow = "billing"
		_, row := acquire(t, db, req)
		if err := store.Release(ctx, db, row.Holder(), "", "", store.EndedIdle, false); err != nil {
			t.Fatal(err)
		}
		age(t, db, "acme", key, "last_run_at = now() - interval '1 hour'")
	}
	claim := func(workflows ...string) []string {
		t.Helper()
		rows, err := store.Claim(ctx, db, store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: workflows, Limit: 10, StuckAfter: time.Minute, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return claimedKeys(rows)
	}

	if got := claim(); got != nil {
		t.Fatalf("claim with no workflows = %q, want none", got)
	}
	if got, want := claim("test", "payouts"), []string{"runnable", "unknown"}; !slices.Equal(got, want) {
		t.Fatalf("claim of test keys = %q, want %q", got, want)
	}
	if info := inspect(t, db, "acme", "billing-1"); info.LeaseExpiresAt != nil || info.Attempts != 1 {
		t.Fatalf("a billing key was touched by a claim for test: %+v", info)
	}
	if got, want := claim("billing"), []string{"billing-1", "billing-2"}; !slices.Equal(got, want) {
		t.Fatalf("claim of billing keys = %q, want %q", got, want)
	}
}

func TestClaimBacksOffPerCompleterFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	fail(t, db, "acme", "k1", 2, store.EndedFailed)
	// Idle a minute for StuckAfter, then 30s doubled once for the second
	// failure: due after two minutes.
	claim := store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 10, StuckAfter: time.Minute,
		Backoff: 30 * time.Second, MaxBackoff: time.Hour, TTL: ttl}
	for _, tc := range []struct {
		idle string
		due  bool
	}{{"90 seconds", false}, {"115 seconds", false}, {"121 seconds", true}} {
		age(t, db, "acme", "k1", "last_run_at = now() - interval '"+tc.idle+"'")
		rows, err := store.Claim(ctx, db, claim)
		if err != nil {
			t.Fatal(err)
		}
		if due := len(rows) == 1; due != tc.due {
			t.Fatalf("claim after %s idle took %d keys, want due %v", tc.idle, len(rows), tc.due)
		}
	}
}

// The keys CountNotDue counts are the free runnable keys a claim with the
// same idle threshold and backoff leaves, and it says when they come due:
// a key a client left less than StuckAfter ago, and one the completer
// failed, idle past StuckAfter but not past its backoff. A key due now, a
// leased one and one on hold are not counted.
func TestTheKeysNotDueAreTheOnesAClaimLeaves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	fail(t, db, "acme", "due", 1, store.EndedIdle)
	fail(t, db, "acme", "left", 1, store.EndedIdle)
	fail(t, db, "acme", "failed", 2, store.EndedFailed)
	fail(t, db, "acme", "held", 1, store.EndedIdle)
	age(t, db, "acme", "due", "last_run_at = now() - interval '1 hour'")
	age(t, db, "acme", "left", "last_run_at = now() - interval '50 seconds'")
	// Idle a minute, then 60 s of backoff for the second failure.
	age(t, db, "acme", "failed", "last_run_at = now() - interval '70 seconds'")
	age(t, db, "acme", "held", "last_run_at = now() - interval '1 hour', hold = 'unknown'")
	if out, _ := acquire(t, db, request(t, "acme", "leased", `{"amount":100}`)); !out.Acquiring() {
		t.Fatalf("acquire = %v, want the lease", out)
	}
	age(t, db, "acme", "leased", "last_run_at = now() - interval '1 hour'")
	n, err := store.CountNotDue(ctx, db, time.Minute, 30*time.Second, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if n.Keys != 2 || n.First <= 8*time.Second || n.First > 10*time.Second || n.Last <= 48*time.Second || n.Last > 50*time.Second {
		t.Fatalf("keys not due = %+v; want 2, due in 10 s and 50 s", n)
	}
	rows, err := store.Claim(ctx, db, store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 10,
		StuckAfter: time.Minute, Backoff: 30 * time.Second, MaxBackoff: time.Hour, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	// The claim takes the due key and the one on hold for an unknown
	// outcome (to reconcile it), and leaves the two not due.
	if got, want := claimedKeys(rows), []string{"due", "held"}; !slices.Equal(got, want) {
		t.Errorf("claim took %q; want %q", got, want)
	}
}

// A claim leaves the key's last run as it was, so a claimed key whose run
// died with its process (its lease ran out, never freed) is due again at
// once, while one a client's run left that way waits for StuckAfter; a
// completer's run cut short by its process stopping leaves the key due at
// once, while a failed one and a client's wait.
func TestAKeyTheCompletersRunLeftIsDueAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	params := store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 10,
		StuckAfter: time.Minute, Backoff: 30 * time.Second, MaxBackoff: time.Hour, TTL: ttl}
	claim := func() []*store.Row {
		t.Helper()
		rows, err := store.Claim(ctx, db, params)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	keys := []string{"died", "cut", "failed", "client-died"}
	for _, key := range keys[:3] {
		fail(t, db, "acme", key, 1, store.EndedIdle)
		age(t, db, "acme", key, "last_run_at = now() - interval '1 hour'")
	}
	rows := claim()
	if got := claimedKeys(rows); !slices.Equal(got, []string{"cut", "died", "failed"}) {
		t.Fatalf("claim took %q; want the three stuck keys", got)
	}
	byKey := map[string]*store.Row{}
	for _, r := range rows {
		byKey[r.Key] = r
	}
	if err := store.Release(ctx, db, byKey["cut"].Holder(), "stopping", "", store.EndedCut, false); err != nil {
		t.Fatal(err)
	}
	if err := store.Release(ctx, db, byKey["failed"].Holder(), "provider down", "", store.EndedFailed, false); err != nil {
		t.Fatal(err)
	}
	// A client's run that died: its lease ran out, never freed.
	if out, _ := acquire(t, db, request(t, "acme", "client-died", `{"amount":100}`)); !out.Acquiring() {
		t.Fatalf("acquire = %v, want the lease", out)
	}
	for _, key := range []string{"died", "client-died"} {
		age(t, db, "acme", key, "lock_expires_at = now() - interval '1 second'")
	}
	if got := claimedKeys(claim()); !slices.Equal(got, []string{"cut", "died"}) {
		t.Errorf("claim after the runs ended took %q; want the cut one and the one whose claimed run died", got)
	}
	var failures int
	if err := db.QueryRow(ctx, `SELECT failures FROM idempotency_keys WHERE idempotency_key = 'cut'`).Scan(&failures); err != nil || failures != 0 {
		t.Errorf("the cut key has %d failures (%v); want none counted", failures, err)
	}
}

// claimedKeys returns the keys of the rows a claim took, sorted.
func claimedKeys(rows []*store.Row) []string {
	var keys []string
	for _, r := range rows {
		keys = append(keys, r.Key)
	}
	slices.Sort(keys)
	return keys
}

// Claims racing over the same keys, as completers in several processes do,
// each take a key at most once: SKIP LOCKED passes over the keys another
// claim has locked instead of waiting for them and then taking them again.
func TestConcurrentClaimsNeverTakeAKeyTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	const keys = 40
	for range keys {
		keyIn(t, db, "acme", uuid.NewString(), "runnable")
	}
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET last_run_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	timePassed(t, db)

	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		mu      sync.Mutex
		claimed = map[uuid.UUID]int{}
	)
	for range 8 {
		wg.Go(func() {
			<-start
			for {
				rows, err := store.Claim(ctx, db, store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 3, StuckAfter: time.Minute, TTL: ttl})
				if err != nil {
					t.Error(err)
					return
				}
				if len(rows) == 0 {
					return
				}
				mu.Lock()
				for _, r := range rows {
					claimed[r.ID]++
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if len(claimed) != keys {
		t.Fatalf("claimed %d distinct keys, want %d", len(claimed), keys)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Errorf("key %v claimed %d times", id, n)
		}
	}
}

func TestCountPutsEveryKeyInExactlyOneState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	for key, state := range map[string]string{
		"finished": "finished", "leased": "leased", "young": "runnable", "stuck": "runnable",
		"dead": "dead", "unknown": "unknown", "reconciling": "unknown", "expired-young": "leased", "expired-old": "leased",
	} {
		keyIn(t, db, "acme", key, state)
	}
	for key, set := range map[string]string{
		"stuck":         "last_run_at = now() - interval '1 hour'",
		"reconciling":   "last_run_at = now() - interval '2 hours'",
		"expired-young": "lock_expires_at = now() - interval '1 second'",
		"expired-old":   "lock_expires_at = now() - interval '1 second', last_run_at = now() - interval '1 hour'",
	} {
		age(t, db, "acme", key, set)
	}
	// The completer holds an unknown key while it reconciles it (the
	// oldest key is claimed first); the key still counts as unknown.
	rows, err := store.Claim(ctx, db, store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 1, StuckAfter: time.Minute, TTL: ttl})
	if err != nil || len(rows) != 1 || rows[0].Key != "reconciling" {
		t.Fatalf("claim = %+v, %v; want the reconciling key", rows, err)
	}
	var total int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&total); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		stuckAfter time.Duration
		want       keyrow.Counts
	}{
		{time.Minute, keyrow.Counts{Finished: 1, InFlight: 1, Waiting: 2, Stuck: 2, Unknown: 2, Dead: 1}},
		{0, keyrow.Counts{Finished: 1, InFlight: 1, Waiting: 0, Stuck: 4, Unknown: 2, Dead: 1}},
		{2 * time.Hour, keyrow.Counts{Finished: 1, InFlight: 1, Waiting: 4, Stuck: 0, Unknown: 2, Dead: 1}},
	} {
		c, err := store.Count(ctx, db, tc.stuckAfter)
		if err != nil {
			t.Fatal(err)
		}
		if c != tc.want || c.Total() != total {
			t.Errorf("Count(%v) = %+v, adding up to %d of %d keys; want %+v", tc.stuckAfter, c, c.Total(), total, tc.want)
		}
	}
}

// TestClaimTakesAKeyReferencedByAStalledHoldersOpenTransaction: the
// workflow's table references the key row (as the reference design's
// rides.idempotency_key_id does), and a holder that stalled inside its
// phase transaction, after inserting such a row, keeps a KEY SHARE lock on
// the key. Once its lease has run out the completer must take the key over,
// as a client retry can, rather than skip it while the stalled transaction
// lasts (for a dead process behind a half-open connection, hours).
func TestClaimTakesAKeyReferencedByAStalledHoldersOpenTransaction(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "a foreign key to idempotency_keys (id) alone cannot exist on a distributed key table (docs/citus.md)")
	ctx := context.Background()
	db := pgtest.Pool(t)
	if _, err := db.Exec(ctx, `CREATE TABLE orders (key_id uuid UNIQUE REFERENCES idempotency_keys (id) ON DELETE SET NULL)`); err != nil {
		t.Fatal(err)
	}
	_, row := acquire(t, db, request(t, "acme", "k1", `{"amount":100}`))
	stalled, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Rollback(ctx)
	if _, err := stalled.Exec(ctx, `INSERT INTO orders (key_id) VALUES ($1)`, row.ID); err != nil {
		t.Fatal(err)
	}
	expire(t, db, "acme", "k1")
	rows, err := store.Claim(ctx, db, store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 10, TTL: ttl})
	if err != nil || len(rows) != 1 || rows[0].ID != row.ID {
		t.Fatalf("claim = %+v, %v; want the expired key although a stalled transaction references it", rows, err)
	}
	if rows[0].LockToken == row.LockToken {
		t.Fatal("the claim kept the stalled holder's token")
	}
}

func TestCountAddsUpWhileKeysFinish(t *testing.T) {
	t.Parallel()
	countAddsUpWhileKeysFinish(t, pgtest.Pool(t))
}

// TestUnfinishedKeysAddUpWhileKeysGoOnHold: the counts of unfinished keys
// and of each definition's read the keys on hold and the others apart; a
// key that goes on hold during a read is counted once.
func TestUnfinishedKeysAddUpWhileKeysGoOnHold(t *testing.T) {
	t.Parallel()
	unfinishedAddsUpWhileKeysGoOnHold(t, pgtest.Pool(t))
}

// unfinishedAddsUpWhileKeysGoOnHold puts keys on hold, one at a time,
// while it reads CountByWorkflow and then CountDefinitions.
func unfinishedAddsUpWhileKeysGoOnHold(t *testing.T, db *pgxpool.Pool) {
	addsUpWhileKeysChange(t, db, `hold = 'unknown'`, unfinishedOfMoving(db))
	if _, err := db.Exec(context.Background(), `DELETE FROM idempotency_keys WHERE workflow = 'moving'`); err != nil {
		t.Fatal(err)
	}
	addsUpWhileKeysChange(t, db, `hold = 'dead'`, func(ctx context.Context) (int, error) {
		counts, err := store.CountDefinitions(ctx, db)
		n := 0
		for _, c := range counts {
			if c.Workflow == "moving" {
				n += c.Unfinished
			}
		}
		return n, err
	})
}

// countAddsUpWhileKeysFinish finishes keys of several tenants one at a
// time while it reads the counts: each read must see every key once,
// unfinished or finished.
func countAddsUpWhileKeysFinish(t *testing.T, db *pgxpool.Pool) {
	addsUpWhileKeysChange(t, db, `finished_at = now(), recovery_point = 'finished', response_status = 200, response_body = ''`,
		func(ctx context.Context) (int, error) {
			c, err := store.Count(ctx, db, time.Minute)
			return c.Total(), err
		})
}

// unfinishedOfMoving is how many unfinished keys of the workflow "moving"
// CountByWorkflow counts.
func unfinishedOfMoving(db *pgxpool.Pool) func(context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		counts, err := store.CountByWorkflow(ctx, db, time.Minute)
		return counts["moving"].Unfinished(), err
	}
}

// movingKeys are the keys addsUpWhileKeysChange changes.
const movingKeys = 300

// addsUpWhileKeysChange inserts movingKeys keys of the workflow "moving"
// through db and changes them one at a time with set (an UPDATE's SET
// list) while it reads count over and over, and fails when a read is not
// movingKeys: every key, each counted once.
func addsUpWhileKeysChange(t *testing.T, db *pgxpool.Pool, set string, count func(context.Context) (int, error)) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params)
SELECT 'acme' || i % 8, 'm' || i, 'moving', '\x00', '{}' FROM generate_series(1, $1) AS i`, movingKeys); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for i := range movingKeys {
			_, err := db.Exec(ctx, `UPDATE idempotency_keys SET `+set+` WHERE tenant = $1 AND idempotency_key = $2`,
				"acme"+strconv.Itoa((i+1)%8), "m"+strconv.Itoa(i+1))
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for reads := 1; ; reads++ {
		n, err := count(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n != movingKeys {
			t.Fatalf("read %d while keys changed (%s) counted %d keys; want the %d keys each counted once", reads, set, n, movingKeys)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return
		default:
		}
	}
}

func TestAClaimLeavesRunnableKeysOutOfAttemptsForBurial(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "out", "runnable")
	keyIn(t, db, "acme", "left", "runnable")
	keyIn(t, db, "acme", "reconciling", "unknown")
	age(t, db, "acme", "out", "failures = 3, last_run_at = now() - interval '1 hour'")
	age(t, db, "acme", "left", "failures = 2, last_run_at = now() - interval '1 hour'")
	// A held key is claimed for reconciliation however often it failed:
	// burial is for runnable keys only.
	age(t, db, "acme", "reconciling", "failures = 5, last_run_at = now() - interval '1 hour'")
	rows, err := store.Claim(ctx, db, store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 10,
		StuckAfter: time.Minute, TTL: ttl, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.Key)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"left", "reconciling"}) {
		t.Errorf("claimed %v; want the key with attempts left and the held one, not the key out of attempts", got)
	}
	n, err := store.Bury(ctx, db, []string{"test"}, nil, 3, time.Minute)
	if err != nil || n != 1 {
		t.Errorf("bury = %d, %v; want the key out of attempts buried", n, err)
	}
}

// TestCountEstimatesTheFinishedKeysOfALargeTable: in a table past
// exactCountPages the finished keys of each workflow are estimated from the
// statistics, close to the keys there are, and the unfinished ones are
// counted exactly.
func TestCountEstimatesTheFinishedKeysOfALargeTable(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "a count reads the statistics past exactCountPages a shard; TestCitusCountEstimatesTheFinishedKeysOfALargeTable loads that on two shards")
	db := pgtest.Pool(t)
	countEstimatesTheFinishedKeysOfALargeTable(t, 30_000, db, db)
}

// countEstimatesTheFinishedKeysOfALargeTable loads, through db, a table of
// keys finished keys of two workflows (with 1 KB responses: 30,000 of them
// are past exactCountPages) and 20 stuck ones, analyzes it, and checks the
// counts read through each of qs.
func countEstimatesTheFinishedKeysOfALargeTable(t *testing.T, keys int, db *pgxpool.Pool, qs ...*pgxpool.Pool) {
	ctx := context.Background()
	const stuck = 20
	refunds := keys / 4
	_, err := db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params,
                              recovery_point, finished_at, response_status, response_body)
SELECT 'acme' || i % 8, 'k' || i, CASE WHEN i % 4 = 0 THEN 'refunds' ELSE 'orders' END, '\x00', '{}',
       'finished', now(), 201, convert_to(repeat('x', 1000), 'UTF8')
FROM generate_series(1, $1) AS i`, keys)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params, last_run_at)
SELECT 'acme' || i % 8, 's' || i, 'orders', '\x00', '{}', now() - interval '1 hour'
FROM generate_series(1, $1) AS i`, stuck)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `ANALYZE idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"orders": keys - refunds, "refunds": refunds}
	for _, q := range qs {
		counts, err := store.CountByWorkflow(ctx, q, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for workflow, finished := range want {
			c := counts[workflow]
			if !c.FinishedEstimated || c.Finished < finished*95/100 || c.Finished > finished*105/100 {
				t.Errorf("%s: %+v; want about %d finished, estimated", workflow, c, finished)
			}
		}
		if c := counts["orders"]; c.Stuck != stuck || c.Unfinished() != stuck {
			t.Errorf("orders: %+v; want exactly %d stuck", c, stuck)
		}
	}
	// Estimated, the finished keys are read from the statistics and the
	// unfinished counted on their own: still each once.
	addsUpWhileKeysChange(t, db, `hold = 'dead'`, unfinishedOfMoving(db))
}
