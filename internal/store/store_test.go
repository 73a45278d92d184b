package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const ttl = 30 * time.Second

func request(t testing.TB, tenant, key, body string) store.Request {
	t.Helper()
	fp, err := keyrow.Fingerprint("test", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return store.Request{Tenant: tenant, Key: key, Workflow: "test", Fingerprint: fp, Params: []byte(body), TTL: ttl,
		Distributed: pgtest.OnCitus()}
}

func acquire(t testing.TB, db store.Querier, req store.Request) (store.Outcome, *store.Row) {
	t.Helper()
	out, row, err := store.Acquire(context.Background(), db, req)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	return out, row
}

// expire makes the key's lease stale, as if its TTL had passed.
func expire(t testing.TB, db *pgxpool.Pool, tenant, key string) {
	t.Helper()
	_, err := db.Exec(context.Background(),
		`UPDATE idempotency_keys SET lock_expires_at = now() - interval '1 second'
		 WHERE tenant = $1 AND idempotency_key = $2`, tenant, key)
	if err != nil {
		t.Fatal(err)
	}
	timePassed(t, db)
}

type snapshot struct {
	RecoveryPoint string
	State         string
	Token         *uuid.UUID
	Status        *int
}

func read(t testing.TB, db *pgxpool.Pool, tenant, key string) snapshot {
	t.Helper()
	var s snapshot
	err := db.QueryRow(context.Background(),
		`SELECT recovery_point, phase_state::text, lock_token, response_status
		 FROM idempotency_keys WHERE tenant = $1 AND idempotency_key = $2`, tenant, key).
		Scan(&s.RecoveryPoint, &s.State, &s.Token, &s.Status)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAcquire64GoroutinesOnOneNewKeyExactlyOneWins(t *testing.T) {
	t.Parallel()
	db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 64
	})
	req := request(t, "acme", "race-key", `{"amount":100}`)

	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		mu       sync.Mutex
		outcomes = map[store.Outcome]int{}
	)
	for range 64 {
		wg.Go(func() {
			<-start
			out, _ := acquire(t, db, req)
			mu.Lock()
			outcomes[out]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if outcomes[store.New] != 1 || outcomes[store.Held] != 63 || len(outcomes) != 2 {
		t.Fatalf("outcomes = %v, want exactly 1 new and 63 held", outcomes)
	}
}

func TestStaleLeaseTakeoverFencesTheOldHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	req := request(t, "acme", "k1", `{"amount":100}`)

	out, old := acquire(t, db, req)
	if out != store.New {
		t.Fatalf("first acquire = %v, want new", out)
	}
	if err := store.Advance(ctx, db, old.Holder(), "charged", []byte(`{"charge":"ch_1"}`), ttl); err != nil {
		t.Fatal(err)
	}
	if out, row := acquire(t, db, req); out != store.Held || row.LeaseLeft <= 0 || row.LeaseLeft > ttl {
		t.Fatalf("acquire during live lease = %v (left %v), want held with time left", out, row.LeaseLeft)
	}

	expire(t, db, "acme", "k1")
	out, taker := acquire(t, db, req)
	if out != store.Resumed || taker.RecoveryPoint != "charged" || string(taker.State) != `{"charge": "ch_1"}` {
		t.Fatalf("takeover = %v at %q with state %s, want resumed at charged", out, taker.RecoveryPoint, taker.State)
	}
	if taker.LockToken == old.LockToken {
		t.Fatal("takeover kept the old fencing token")
	}
	before := read(t, db, "acme", "k1")

	if err := store.Advance(ctx, db, old.Holder(), "shipped", []byte(`{}`), ttl); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("old holder Advance = %v, want ErrLeaseLost", err)
	}
	resp := keyrow.Response{Status: 201, Body: []byte("{}")}
	if err := store.Finish(ctx, db, old.Holder(), nil, resp); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("old holder Finish = %v, want ErrLeaseLost", err)
	}
	if err := store.Release(ctx, db, old.Holder(), "boom", "", store.EndedIdle, false); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("old holder Release = %v, want ErrLeaseLost", err)
	}
	if _, err := store.Renew(ctx, db, old.Holder(), ttl); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("old holder Renew = %v, want ErrLeaseLost", err)
	}
	after := read(t, db, "acme", "k1")
	if after.RecoveryPoint != before.RecoveryPoint || after.State != before.State ||
		after.Status != nil || *after.Token != taker.LockToken {
		t.Fatalf("fenced writes changed the row: before %+v after %+v", before, after)
	}

	// The new holder's writes go through.
	if err := store.Finish(ctx, db, taker.Holder(), taker.State, resp); err != nil {
		t.Fatal(err)
	}
}

func TestFencedAdvancePipelinedWithCommitRollsBackTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	if _, err := db.Exec(ctx, `CREATE TABLE effects (note text)`); err != nil {
		t.Fatal(err)
	}
	req := request(t, "acme", "k1", `{}`)
	_, old := acquire(t, db, req)
	expire(t, db, "acme", "k1")
	acquire(t, db, req)

	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ('should not persist')`); err != nil {
		t.Fatal(err)
	}
	w, err := store.AdvanceWrite(old.Holder(), "next", nil, ttl)
	if err != nil {
		t.Fatal(err)
	}
	q := w.QueuedQuery()
	b := &pgx.Batch{}
	b.Queue(q.SQL, q.Arguments...)
	b.Queue("COMMIT")
	if err := store.AsLeaseLost(tx.SendBatch(ctx, b).Close()); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("pipelined advance = %v, want ErrLeaseLost", err)
	}
	tx.Rollback(ctx)
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("effects after lost lease = %d (%v), want 0", n, err)
	}
}

func TestSameKeyUnderTwoTenantsIsTwoIndependentKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	a := request(t, "tenant-a", "shared", `{"amount":1}`)
	b := request(t, "tenant-b", "shared", `{"amount":2}`)

	outA, rowA := acquire(t, db, a)
	outB, rowB := acquire(t, db, b)
	if outA != store.New || outB != store.New || rowA.ID == rowB.ID {
		t.Fatalf("outcomes %v/%v ids %v/%v, want two new rows", outA, outB, rowA.ID, rowB.ID)
	}
	if err := store.Finish(ctx, db, rowA.Holder(), nil, keyrow.Response{Status: 201, Body: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if out, row := acquire(t, db, a); out != store.Replay || string(row.Response.Body) != "a" {
		t.Fatalf("tenant a retry = %v, want replay of a", out)
	}
	if out, _ := acquire(t, db, b); out != store.Held {
		t.Fatalf("tenant b retry = %v, want held (its own lease is live)", out)
	}
}

func TestReplayReturnsStoredResponseByteForByte(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	req := request(t, "acme", "k1", `{"b":2,"a":1}`)
	_, row := acquire(t, db, req)
	body := []byte("{\"id\": 7,\n \"raw\":\"\\u00e9\x00\xff\"}")
	hdr := http.Header{"Content-Type": {"application/json"}, "X-Multi": {"1", "2"}}
	if err := store.Finish(ctx, db, row.Holder(), []byte(`{"n":1}`), keyrow.Response{Status: 402, Header: hdr, Body: body}); err != nil {
		t.Fatal(err)
	}
	// Same meaning, other spelling: still a replay.
	out, got := acquire(t, db, request(t, "acme", "k1", `{ "a": 1.0, "b": 2 }`))
	if out != store.Replay {
		t.Fatalf("retry = %v, want replay", out)
	}
	if got.Response.Status != 402 || string(got.Response.Body) != string(body) ||
		len(got.Response.Header["X-Multi"]) != 2 || got.Response.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("replayed %d %q %v, want the stored response", got.Response.Status, got.Response.Body, got.Response.Header)
	}
	if out, _ := acquire(t, db, request(t, "acme", "k1", `{"a":1,"b":3}`)); out != store.Mismatch {
		t.Fatalf("other payload = %v, want mismatch", out)
	}
}

func TestReleaseKeepsRecoveryPointAndHoldParksTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	req := request(t, "acme", "k1", `{}`)
	_, row := acquire(t, db, req)
	if err := store.Advance(ctx, db, row.Holder(), "ride_created", []byte(`{"ride":1}`), ttl); err != nil {
		t.Fatal(err)
	}
	if err := store.Release(ctx, db, row.Holder(), "stripe down", "", store.EndedIdle, false); err != nil {
		t.Fatal(err)
	}
	out, row := acquire(t, db, req)
	if out != store.Resumed || row.RecoveryPoint != "ride_created" || row.Attempts != 2 || row.LastError != "stripe down" {
		t.Fatalf("after release: %v at %q attempts %d err %q, want resumed at ride_created, attempt 2",
			out, row.RecoveryPoint, row.Attempts, row.LastError)
	}
	if err := store.Release(ctx, db, row.Holder(), "timeout", keyrow.HoldUnknown, store.EndedIdle, false); err != nil {
		t.Fatal(err)
	}
	if out, row := acquire(t, db, req); out != store.Parked || row.Hold != keyrow.HoldUnknown {
		t.Fatalf("after hold: %v (%q), want parked unknown", out, row.Hold)
	}
}

// TestAPhaseCommitClearsTheErrorOfAnEarlierRun: the error a key keeps is
// that of its last run that failed, and only until a run commits a phase
// of it. A key that failed once, then moved on and was left by a crash (or
// is running now) shows no error it has since got past, as its failures
// are reset.
func TestAPhaseCommitClearsTheErrorOfAnEarlierRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	req := request(t, "acme", "k1", `{}`)
	_, row := acquire(t, db, req)
	if err := store.Release(ctx, db, row.Holder(), "stripe down", "", store.EndedFailed, false); err != nil {
		t.Fatal(err)
	}
	info := inspect(t, db, "acme", "k1")
	if info.LastError != "stripe down" || info.Failures != 1 {
		t.Fatalf("after a failed run: last error %q, failures %d; want the run's error, one failure", info.LastError, info.Failures)
	}
	if _, row = acquire(t, db, req); row == nil {
		t.Fatal("the retry did not take the key")
	}
	if err := store.Advance(ctx, db, row.Holder(), "ride_created", []byte(`{"ride":1}`), ttl); err != nil {
		t.Fatal(err)
	}
	// The run that committed ride_created now dies without a word.
	info = inspect(t, db, "acme", "k1")
	if info.LastError != "" || info.Failures != 0 || info.RecoveryPoint != "ride_created" {
		t.Fatalf("after a phase commit: at %q, last error %q, failures %d; want ride_created, no error, no failure",
			info.RecoveryPoint, info.LastError, info.Failures)
	}
}

func TestAcquireReplayAndHeldEachSendOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, counter := pgtest.CountingPool(t, nil)

	assertOne := func(name string, want store.Outcome, req store.Request) *store.Row {
		t.Helper()
		counter.Reset()
		out, row := acquire(t, db, req)
		if out != want {
			t.Fatalf("%s: outcome %v, want %v", name, out, want)
		}
		// On Citus an existing key is read after the insert found it
		// (see acquireDistributed): two statements, neither a write.
		n := 1
		if req.Distributed && want != store.New {
			n = 2
		}
		if counter.Statements() != n || counter.RoundTrips() != n {
			t.Fatalf("%s: %d statements, %d round trips, want %d and %d: %q", name, counter.Statements(), counter.RoundTrips(), n, n, counter.SQL())
		}
		return row
	}
	row := assertOne("new", store.New, request(t, "acme", "k1", `{}`))
	assertOne("held", store.Held, request(t, "acme", "k1", `{}`))
	if err := store.Finish(ctx, db, row.Holder(), nil, keyrow.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	assertOne("replay", store.Replay, request(t, "acme", "k1", `{}`))
	assertOne("mismatch", store.Mismatch, request(t, "acme", "k1", `{"x":1}`))
}

// TestAcquireResumesAKeyWithASecondStatement: a key found unfinished with
// a free or expired lease is taken over by a second statement, which takes
// the lease only if the newest row version still allows it; the first,
// which makes a new key, a replay or a conflict cost one statement, only
// read it.
func TestAcquireResumesAKeyWithASecondStatement(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "a distributed key table takes every case in one statement")
	ctx := context.Background()
	db, counter := pgtest.CountingPool(t, nil)
	req := request(t, "acme", "k1", `{}`)
	_, row := acquire(t, db, req)
	if err := store.Release(ctx, db, row.Holder(), "provider down", "", store.EndedIdle, false); err != nil {
		t.Fatal(err)
	}
	counter.Reset()
	out, resumed := acquire(t, db, req)
	if out != store.Resumed || resumed.LockToken == uuid.Nil || resumed.LockToken == row.LockToken || resumed.Attempts != 2 {
		t.Fatalf("acquire after release = %v, token %v, attempts %d; want Resumed with a new token, attempt 2", out, resumed.LockToken, resumed.Attempts)
	}
	sql := counter.SQL()
	if len(sql) != 2 || counter.RoundTrips() != 2 || strings.Contains(sql[0], "DO UPDATE") || !strings.Contains(sql[1], "DO UPDATE") {
		t.Fatalf("resume sent %d statements in %d round trips, want the read and the takeover: %q", len(sql), counter.RoundTrips(), sql)
	}
	if !heldByAnother(t, db, "k1") {
		t.Fatal("the resumed key is free to take")
	}
}

func TestRenewExtendsTheLeaseByTheDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	_, row := acquire(t, db, request(t, "acme", "k1", `{}`))
	left, err := store.Renew(ctx, db, row.Holder(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if left < 59*time.Minute || left > time.Hour {
		t.Fatalf("left after renew = %v, want about an hour", left)
	}
	if out, held := acquire(t, db, request(t, "acme", "k1", `{}`)); out != store.Held || held.LeaseLeft < 59*time.Minute {
		t.Fatalf("acquire = %v, left %v; want held for about an hour", out, held.LeaseLeft)
	}
}

// A key inserted by a transaction that commits while Acquire waits on it is
// invisible to Acquire's snapshot: the insert waits for that transaction
// and then sees the row, the read of it does not. Acquire must run again
// rather than report nothing.
func TestAcquireSeesARowCommittedAfterItsSnapshot(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "the race it stages is the single-Postgres statement's (a read before the upsert), and it watches for the lock wait on the coordinator, where Citus does not wait")
	ctx := context.Background()
	db, counter := pgtest.CountingPool(t, nil)
	req := request(t, "acme", "k1", `{}`)

	first, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if out, _, err := store.Acquire(ctx, first, req); err != nil || out != store.New {
		t.Fatalf("first acquire: %v %v", out, err)
	}
	counter.Reset()

	type result struct {
		out store.Outcome
		err error
	}
	second := make(chan result, 1)
	go func() {
		out, _, err := store.Acquire(ctx, db, req)
		second <- result{out, err}
	}()
	// Commit the first insert only once the second waits on it.
	for {
		var waiting bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO idempotency_keys%')`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-second
	if res.err != nil || res.out != store.Held {
		t.Fatalf("second acquire: %v %v, want held", res.out, res.err)
	}
	acquires := 0
	for _, q := range counter.SQL() {
		if strings.Contains(q, "WITH found AS") {
			acquires++
		}
	}
	if acquires != 2 {
		t.Fatalf("the acquire statement ran %d times, want 2 (the miss, then the retry)", acquires)
	}
}

// TestNewKeysGetTimeOrderedIDs checks that new rows get UUIDv7 ids, in the
// order they were created, so that they land at the right edge of the
// primary key's index.
func TestNewKeysGetTimeOrderedIDs(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	var last uuid.UUID
	for i := range 20 {
		_, row := acquire(t, db, request(t, "acme", fmt.Sprintf("k%d", i), `{}`))
		if row.ID.Version() != 7 || (i > 0 && bytes.Compare(row.ID[:], last[:]) <= 0) {
			t.Fatalf("key %d got id %v after %v; want increasing version 7 ids", i, row.ID, last)
		}
		last = row.ID
	}
}

// TestLeaseWritesDoNotWaitForTheFlushOfAnythingElse checks that acquire and
// renew make only their own transaction's commit asynchronous: the session
// that ran them keeps its synchronous_commit.
func TestLeaseWritesDoNotWaitForTheFlushOfAnythingElse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "remote_apply"
	})
	setting := func(after string) {
		t.Helper()
		var got string
		if err := db.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got); err != nil || got != "remote_apply" {
			t.Fatalf("synchronous_commit after %s = %q (%v), want the session's remote_apply", after, got, err)
		}
	}
	_, row := acquire(t, db, request(t, "acme", "k1", `{}`))
	setting("acquire")
	if _, err := store.Renew(ctx, db, row.Holder(), ttl); err != nil {
		t.Fatal(err)
	}
	setting("renew")
}

// TestReplayedHeadersAreTheStoredOnes replays responses with the common
// JSON header, another header and none.
func TestReplayedHeadersAreTheStoredOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	for i, hdr := range []http.Header{
		{"Content-Type": {"application/json"}},
		{"Content-Type": {"application/json; charset=utf-8"}},
		{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		nil,
	} {
		req := request(t, "acme", fmt.Sprintf("k%d", i), `{}`)
		_, row := acquire(t, db, req)
		if err := store.Finish(ctx, db, row.Holder(), nil, keyrow.Response{Status: 201, Header: hdr, Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		out, got := acquire(t, db, req)
		if out != store.Replay || !reflect.DeepEqual(got.Response.Header, hdr) {
			t.Errorf("replayed header %v, want %v", got.Response.Header, hdr)
		}
	}
}

// TestAPhasesAdvanceIsAHOTUpdate: a phase's commit rewrites its key's row
// in place, a HOT update, with no new entry in any index: no index names a
// column the advance changes, not even in its predicate, and the table
// leaves room in its pages for the new version.
func TestAPhasesAdvanceIsAHOTUpdate(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "the updates run on the workers, whose counters the coordinator does not see")
	ctx := context.Background()
	db := pgtest.Pool(t)
	var holders []store.Holder
	for i := range 4 {
		_, row := acquire(t, db, request(t, "acme", fmt.Sprintf("k%d", i), `{"amount":100}`))
		holders = append(holders, row.Holder())
	}
	// The counters of the transaction, read inside it: exact, and on every
	// supported PostgreSQL.
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after the checks
	for _, h := range holders {
		for _, point := range []string{"charged", "shipped"} {
			if err := store.Advance(ctx, tx, h, point, []byte(`{"charge":"ch_1"}`), ttl); err != nil {
				t.Fatal(err)
			}
			h.Point = point
		}
	}
	var updated, hot int64
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_updated('idempotency_keys'::regclass),
       pg_stat_get_xact_tuples_hot_updated('idempotency_keys'::regclass)`).Scan(&updated, &hot); err != nil {
		t.Fatal(err)
	}
	if updated != 8 || hot != updated {
		t.Fatalf("8 advances updated %d rows, %d of them HOT; want 8 HOT updates", updated, hot)
	}
}
