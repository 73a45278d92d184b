package store_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// keyIn creates the tenant's key through the store API and leaves it in
// state: "finished", "leased" (a live lease), "runnable" (free, at
// recovery point "charged"), "dead" or "unknown" (held at "charged").
func keyIn(t *testing.T, db store.Querier, tenant, key, state string) *store.Row {
	t.Helper()
	ctx := context.Background()
	out, row := acquire(t, db, request(t, tenant, key, `{"amount":100}`))
	if out != store.New {
		t.Fatalf("acquire %s/%s = %v, want new", tenant, key, out)
	}
	if state == "leased" {
		return row
	}
	if state == "finished" {
		resp := keyrow.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_1"}`)}
		if err := store.Finish(ctx, db, row.Holder(), []byte(`{"charge":"ch_1"}`), resp); err != nil {
			t.Fatal(err)
		}
		return row
	}
	if err := store.Advance(ctx, db, row.Holder(), "charged", []byte(`{"charge":"ch_1"}`), ttl); err != nil {
		t.Fatal(err)
	}
	hold := map[string]keyrow.Hold{"runnable": "", "dead": keyrow.HoldDead, "unknown": keyrow.HoldUnknown}[state]
	if err := store.Release(ctx, db, row.Holder(), "card declined", hold, store.EndedIdle, false); err != nil {
		t.Fatal(err)
	}
	return row
}

// age rewrites the key's timestamps with set, an SQL assignment list, as if
// time had passed.
func age(t *testing.T, db store.Querier, tenant, key, set string) {
	t.Helper()
	tag, err := db.Exec(context.Background(),
		`UPDATE idempotency_keys SET `+set+` WHERE tenant = $1 AND idempotency_key = $2`, tenant, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("age %s/%s: %v (%d rows)", tenant, key, err, tag.RowsAffected())
	}
	timePassed(t, db)
}

// timePassed is pgtest.TimePassed.
func timePassed(t testing.TB, db store.Querier) {
	t.Helper()
	pgtest.TimePassed(t, db)
}

func keysOf(infos []keyrow.Row) []string {
	keys := make([]string, len(infos))
	for i, info := range infos {
		keys[i] = info.Key
	}
	return keys
}

func TestInspectFinishedKeyShowsItsStoredResponse(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	row := keyIn(t, db, "acme", "k1", "finished")

	info, err := store.Inspect(context.Background(), db, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != row.ID || info.Tenant != "acme" || info.Key != "k1" || info.Workflow != "test" ||
		info.RecoveryPoint != keyrow.Finished || info.Hold != "" || info.Attempts != 1 || info.LastError != "" {
		t.Fatalf("info = %+v", info)
	}
	if info.ResponseStatus == nil || *info.ResponseStatus != 201 || string(info.ResponseBody) != `{"id":"ch_1"}` ||
		info.ResponseHeader.Get("Content-Type") != "application/json" {
		t.Fatalf("response = %v %v %q, want the stored one", info.ResponseStatus, info.ResponseHeader, info.ResponseBody)
	}
	if string(info.Params) != `{"amount": 100}` || string(info.State) != `{"charge": "ch_1"}` {
		t.Fatalf("params %s, state %s", info.Params, info.State)
	}
	if info.FinishedAt == nil || info.LeaseTakenAt != nil || info.LeaseExpiresAt != nil || info.LeaseLeft != 0 {
		t.Fatalf("finished %v, locked %v, expires %v, lease left %v: want finished and free",
			info.FinishedAt, info.LeaseTakenAt, info.LeaseExpiresAt, info.LeaseLeft)
	}
}

func TestInspectLeasedKeyShowsTheLeaseLeft(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "leased")

	info, err := store.Inspect(context.Background(), db, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if info.LeaseLeft <= 0 || info.LeaseLeft > ttl || info.LeaseTakenAt == nil || info.LeaseExpiresAt == nil {
		t.Fatalf("lease left %v, locked %v: want a live lease of at most %v", info.LeaseLeft, info.LeaseTakenAt, ttl)
	}
	if info.ResponseStatus != nil || info.ResponseHeader != nil || info.ResponseBody != nil || info.FinishedAt != nil {
		t.Fatalf("unfinished key has a response: %+v", info)
	}
}

func TestInspectMissingKeyOrOtherTenantIsErrNotFound(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "finished")

	for _, tk := range [][2]string{{"acme", "k2"}, {"globex", "k1"}} {
		if _, err := store.Inspect(context.Background(), db, tk[0], tk[1]); !errors.Is(err, keyrow.ErrNotFound) {
			t.Errorf("Inspect(%s, %s) = %v, want ErrNotFound", tk[0], tk[1], err)
		}
	}
}

func TestListSelectsStuckUnknownAndDeadKeysIdleLongestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	for key, state := range map[string]string{
		"finished": "finished", "leased": "leased", "stuck-old": "runnable", "stuck-older": "runnable",
		"fresh": "runnable", "dead-old": "dead", "dead-older": "dead", "unknown": "unknown",
	} {
		keyIn(t, db, "acme", key, state)
	}
	age(t, db, "acme", "stuck-old", "last_run_at = now() - interval '2 minutes'")
	age(t, db, "acme", "stuck-older", "last_run_at = now() - interval '3 minutes'")
	age(t, db, "acme", "dead-old", "last_run_at = now() - interval '1 hour'")
	age(t, db, "acme", "dead-older", "last_run_at = now() - interval '2 hours'")
	// An expired lease does not keep a key from being stuck; a live one does.
	age(t, db, "acme", "leased", "last_run_at = now() - interval '5 minutes'")
	keyIn(t, db, "acme", "expired", "leased")
	age(t, db, "acme", "expired", "last_run_at = now() - interval '4 minutes', lock_expires_at = now() - interval '1 second'")

	for _, tc := range []struct {
		name   string
		filter keyrow.ListFilter
		want   []string
	}{
		{"stuck", keyrow.ListFilter{Status: keyrow.StatusStuck, StuckAfter: time.Minute}, []string{"expired", "stuck-older", "stuck-old"}},
		{"stuck limited", keyrow.ListFilter{Status: keyrow.StatusStuck, StuckAfter: time.Minute, Limit: 2}, []string{"expired", "stuck-older"}},
		{"dead", keyrow.ListFilter{Status: keyrow.StatusDead}, []string{"dead-older", "dead-old"}},
		{"unknown", keyrow.ListFilter{Status: keyrow.StatusUnknown}, []string{"unknown"}},
	} {
		keys, err := store.List(ctx, db, tc.filter)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := keysOf(keys.Keys); !slices.Equal(got, tc.want) {
			t.Errorf("%s: listed %q, want %q", tc.name, got, tc.want)
		}
	}

	// Operators compare the list with the stats gauge; they must agree.
	counts, err := store.Count(ctx, db, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := keyrow.Counts{Finished: 1, InFlight: 1, Waiting: 1, Stuck: 3, Unknown: 1, Dead: 2}
	if counts != want {
		t.Fatalf("counts = %+v, want %+v: 3 stuck, 2 dead, 1 unknown as listed", counts, want)
	}

	dead, err := store.List(ctx, db, keyrow.ListFilter{Status: keyrow.StatusDead})
	if err != nil {
		t.Fatal(err)
	}
	if d := dead.Keys[0]; d.Hold != keyrow.HoldDead || d.RecoveryPoint != "charged" || d.LastError != "card declined" || d.LeaseLeft != 0 {
		t.Fatalf("dead key = %+v", d)
	}
}

func TestListOfAnInvalidFilterIsAnError(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	for _, f := range []keyrow.ListFilter{
		{Status: "bogus"}, {Status: keyrow.StatusDead, Limit: -1}, {Status: keyrow.StatusStuck, StuckAfter: -time.Second},
		{OlderThan: -time.Second}, {After: "not-a-cursor"}, {Status: keyrow.StatusDead, After: "0b3f6a1e-0000-7000-8000-000000000000"},
	} {
		if _, err := store.List(context.Background(), db, f); err == nil {
			t.Errorf("List(%+v) succeeded, want an error", f)
		}
	}
}

// lastQuery records the last statement a connection sent, with its arguments.
type lastQuery struct {
	mu   sync.Mutex
	sql  string
	args []any
}

func (l *lastQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql, l.args = data.SQL, data.Args
	return ctx
}

func (l *lastQuery) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestListUsesTheIndexes: a listing of unfinished keys reads the keys the
// completer's walk has yet to pass through the index on created_xid, and
// the watch, never the table; one of keys on hold reads its partial index.
func TestListUsesTheIndexes(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "it reads a single Postgres's plans; Citus plans the scan on each shard")
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	var last lastQuery
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = &last
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	// On a near-empty table a sequential scan is cheapest; forbidding it
	// shows whether the planner can prove the partial index applies.
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		filter keyrow.ListFilter
		index  string
	}{
		{keyrow.ListFilter{Status: keyrow.StatusStuck, StuckAfter: time.Minute}, "idempotency_keys_created_xid"},
		{keyrow.ListFilter{Status: keyrow.StatusDead}, "idempotency_keys_held"},
		{keyrow.ListFilter{Status: keyrow.StatusUnknown}, "idempotency_keys_held"},
		{keyrow.ListFilter{Status: keyrow.StatusDead, After: "1700000000000000_0b3f6a1e-0000-7000-8000-000000000000"}, "idempotency_keys_held"},
		{keyrow.ListFilter{Status: keyrow.StatusInFlight}, "idempotency_keys_created_xid"},
		{keyrow.ListFilter{}, "idempotency_keys_pkey"},
		{keyrow.ListFilter{Status: keyrow.StatusFinished, After: "0b3f6a1e-0000-7000-8000-000000000000"}, "idempotency_keys_pkey"},
	} {
		if _, err := store.List(ctx, traced, tc.filter); err != nil {
			t.Fatal(err)
		}
		last.mu.Lock()
		sql, args := last.sql, last.args
		last.mu.Unlock()
		rows, err := conn.Query(ctx, "EXPLAIN "+sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		// On a near-empty table the planner sorts the few rows it expects
		// rather than read them in order; what matters is that it never
		// reads the table itself. The large-table benchmark times pages.
		if !strings.Contains(plan, tc.index) || strings.Contains(plan, "Seq Scan") {
			t.Errorf("List(%+v) plan does not read %s in order:\n%s", tc.filter, tc.index, plan)
		}
	}
}

func TestRetryMakesADeadKeyClaimableWithAFreshFailureBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	row := keyIn(t, db, "acme", "k1", "dead")
	age(t, db, "acme", "k1", "failures = 10, last_run_at = now() - interval '1 hour'")
	// An hour's backoff per failure: a key with any failures left on it,
	// touched just now by Retry, is not due.
	claim := store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 10, Backoff: time.Hour, MaxBackoff: time.Hour, TTL: ttl}

	if claimed, err := store.Claim(ctx, db, claim); err != nil || len(claimed) != 0 {
		t.Fatalf("claim before retry = %d keys, %v; want none", len(claimed), err)
	}
	if err := store.Retry(ctx, db, "acme", "k1", nil); err != nil {
		t.Fatal(err)
	}
	if info := inspect(t, db, "acme", "k1"); info.Failures != 0 || info.Hold != "" {
		t.Fatalf("after retry: failures %d, hold %q; want 0 and runnable", info.Failures, info.Hold)
	}
	claimed, err := store.Claim(ctx, db, claim)
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 1 || claimed[0].ID != row.ID || claimed[0].RecoveryPoint != "charged" ||
		claimed[0].Attempts != 2 || claimed[0].Hold != "" {
		t.Fatalf("claim after retry = %+v, want the key at charged on its second run", claimed)
	}
	// Its ten failures are forgotten: burying needs ten more.
	age(t, db, "acme", "k1", "lock_expires_at = now() - interval '1 second', last_run_at = now() - interval '1 hour'")
	if n, err := store.Bury(ctx, db, []string{"test"}, nil, 10, time.Minute); err != nil || n != 0 {
		t.Fatalf("bury after retry = %d, %v; want none", n, err)
	}
}

func TestRetryKeepsAnOldKeyFromBeingExpiredAsAbandoned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "dead")
	age(t, db, "acme", "k1", "last_run_at = now() - interval '3 days'")

	if err := store.Retry(ctx, db, "acme", "k1", nil); err != nil {
		t.Fatal(err)
	}
	if n, err := store.Expire(ctx, db, "", 24*time.Hour, 100, pgtest.OnCitus()); err != nil || n != 0 {
		t.Fatalf("expire after retry = %d, %v; want the retried key left to run", n, err)
	}
}

func TestRetryUnknownKeyLetsAClientResumeIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "unknown")

	if out, _ := acquire(t, db, request(t, "acme", "k1", `{"amount":100}`)); out != store.Parked {
		t.Fatalf("acquire before retry = %v, want parked", out)
	}
	if err := store.Retry(ctx, db, "acme", "k1", nil); err != nil {
		t.Fatal(err)
	}
	if out, row := acquire(t, db, request(t, "acme", "k1", `{"amount":100}`)); out != store.Resumed || row.RecoveryPoint != "charged" {
		t.Fatalf("acquire after retry = %v at %q, want resumed at charged", out, row.RecoveryPoint)
	}
}

func TestRetryOfAMissingOrUnheldKeySaysWhich(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	for key, state := range map[string]string{"finished": "finished", "leased": "leased", "runnable": "runnable"} {
		keyIn(t, db, "acme", key, state)
		if err := store.Retry(ctx, db, "acme", key, nil); !errors.Is(err, keyrow.ErrNotHeld) {
			t.Errorf("Retry of a %s key = %v, want ErrNotHeld", state, err)
		}
	}
	if err := store.Retry(ctx, db, "acme", "missing", nil); !errors.Is(err, keyrow.ErrNotFound) {
		t.Errorf("Retry of a missing key = %v, want ErrNotFound", err)
	}
}

func TestReapCandidatesCountsWhatTheReaperThenDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	const retention = 24 * time.Hour
	for key, state := range map[string]string{
		"finished-old": "finished", "finished-older": "finished", "finished-new": "finished",
		"dead-old": "dead", "runnable-old": "runnable", "dead-new": "dead",
		"unknown-old": "unknown", "leased-old": "leased",
	} {
		keyIn(t, db, "acme", key, state)
	}
	age(t, db, "acme", "finished-old", "finished_at = now() - interval '25 hours', created_at = now() - interval '25 hours'")
	age(t, db, "acme", "finished-older", "finished_at = now() - interval '3 days', created_at = now() - interval '3 days'")
	for _, key := range []string{"dead-old", "runnable-old", "unknown-old", "leased-old"} {
		age(t, db, "acme", key, "last_run_at = now() - interval '2 days', created_at = now() - interval '2 days'")
	}

	finished, abandoned, err := store.ReapCandidates(ctx, db, "", retention)
	if err != nil {
		t.Fatal(err)
	}
	if finished != 2 || abandoned != 2 {
		t.Fatalf("candidates = %d finished, %d abandoned; want 2 and 2", finished, abandoned)
	}
	if c, err := store.Count(ctx, db, 0); err != nil || c.Finished != 3 || c.Dead != 2 {
		t.Fatalf("after dry run counts = %+v, %v; want nothing changed", c, err)
	}

	expired, err := store.Expire(ctx, db, "", retention, 100, pgtest.OnCitus())
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := store.Reap(ctx, db, "test", retention, 100, pgtest.OnCitus())
	if err != nil {
		t.Fatal(err)
	}
	if deleted != finished || expired != abandoned {
		t.Fatalf("reaper deleted %d and expired %d, dry run said %d and %d", deleted, expired, finished, abandoned)
	}
	if _, _, err := store.ReapCandidates(ctx, db, "", 0); err == nil {
		t.Fatal("ReapCandidates with zero retention succeeded, want an error")
	}
}

func inspect(t *testing.T, db store.Querier, tenant, key string) *keyrow.Row {
	t.Helper()
	info, err := store.Inspect(context.Background(), db, tenant, key)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// TestHoldStopsAKeyUntilRetried: an operator's hold parks an unfinished
// key as dead, fencing out the run that held its lease; neither the
// completer nor a request runs it until Retry, which keeps a call the run
// was cut short in pending, to be reconciled.
func TestHoldStopsAKeyUntilRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	row := keyIn(t, db, "acme", "k1", "leased")
	// The run was about to make a call not safe to repeat when its process
	// died; its lease runs out.
	age(t, db, "acme", "k1", "call_pending = 'charged', last_run_at = now() - interval '1 hour'")

	if err := store.Hold(ctx, db, "acme", "k1", nil); err != nil {
		t.Fatal(err)
	}
	info := inspect(t, db, "acme", "k1")
	if info.Hold != keyrow.HoldDead || info.LeaseTakenAt != nil || info.RecoveryPoint != keyrow.Started || info.CallPending != "charged" {
		t.Fatalf("after hold: hold %q, lease %v, at %q, call pending %q; want dead, no lease, at started, the call pending",
			info.Hold, info.LeaseTakenAt, info.RecoveryPoint, info.CallPending)
	}
	// The holder, had it lived, is fenced out: it cannot take the key off
	// hold by committing a phase.
	if err := store.Advance(ctx, db, row.Holder(), "charged", []byte(`{}`), ttl); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("the old holder's commit after hold = %v, want ErrLeaseLost", err)
	}
	claim := store.ClaimParams{Distributed: pgtest.OnCitus(), Workflows: []string{"test"}, Limit: 10, TTL: ttl}
	if claimed, err := store.Claim(ctx, db, claim); err != nil || len(claimed) != 0 {
		t.Fatalf("claim of a held key = %d keys, %v; want none", len(claimed), err)
	}
	if out, _ := acquire(t, db, request(t, "acme", "k1", `{"amount":100}`)); out != store.Parked {
		t.Fatalf("a request for a held key = %v, want parked", out)
	}
	for _, tc := range []struct {
		key  string
		want error
	}{{"k1", keyrow.ErrNotRunnable}, {"missing", keyrow.ErrNotFound}} {
		if err := store.Hold(ctx, db, "acme", tc.key, nil); !errors.Is(err, tc.want) {
			t.Errorf("hold of %s = %v, want %v", tc.key, err, tc.want)
		}
	}
	keyIn(t, db, "acme", "done", "finished")
	if err := store.Hold(ctx, db, "acme", "done", nil); !errors.Is(err, keyrow.ErrNotRunnable) {
		t.Errorf("hold of a finished key = %v, want ErrNotRunnable", err)
	}

	if err := store.Retry(ctx, db, "acme", "k1", nil); err != nil {
		t.Fatal(err)
	}
	age(t, db, "acme", "k1", "last_run_at = now() - interval '1 hour'")
	claimed, err := store.Claim(ctx, db, claim)
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 1 || claimed[0].ID != row.ID || claimed[0].CallPending != "charged" {
		t.Fatalf("claim after retry = %+v, want the key with its call pending, to reconcile", claimed)
	}

	// Retrying an unknown key is the operator's word on its call: the
	// pending call goes.
	keyIn(t, db, "acme", "k2", "unknown")
	age(t, db, "acme", "k2", "call_pending = 'charged'")
	if err := store.Retry(ctx, db, "acme", "k2", nil); err != nil {
		t.Fatal(err)
	}
	if info := inspect(t, db, "acme", "k2"); info.CallPending != "" {
		t.Fatalf("after retrying an unknown key: call pending %q, want none", info.CallPending)
	}
}

// TestHoldGivenSeenLeavesALeaseANewRunTookAlone: a hold given what inspect
// showed applies only while the key is as shown.
func TestHoldGivenSeenLeavesALeaseANewRunTookAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "runnable")
	seen := inspect(t, db, "acme", "k1").Seen()
	if out, _ := acquire(t, db, request(t, "acme", "k1", `{"amount":100}`)); out != store.Resumed {
		t.Fatalf("acquire = %v, want resumed", out)
	}
	err := store.Hold(ctx, db, "acme", "k1", &seen)
	if !errors.Is(err, keyrow.ErrChanged) {
		t.Fatalf("hold after a new run took the lease = %v, want ErrChanged", err)
	}
	if info := inspect(t, db, "acme", "k1"); info.Hold != "" || info.LeaseTakenAt == nil {
		t.Fatalf("after the refused hold: hold %q, lease %v; want the new run's lease left alone", info.Hold, info.LeaseTakenAt)
	}
}

// TestAKeyWithANulByteIsNotFound: no stored tenant or key holds a NUL
// byte (a text column cannot), so an operator who names one is told the
// key is not found, by every action, and nothing is audited.
func TestAKeyWithANulByteIsNotFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "leased")
	for _, tk := range [][2]string{{"acme", "k1\x00"}, {"ac\x00me", "k1"}} {
		tenant, key := tk[0], tk[1]
		if _, err := store.Inspect(ctx, db, tenant, key); !errors.Is(err, keyrow.ErrNotFound) {
			t.Errorf("inspect %q %q: %v, want ErrNotFound", tenant, key, err)
		}
		for name, act := range map[string]func() error{
			"hold":  func() error { return store.Hold(ctx, db, tenant, key, nil) },
			"retry": func() error { return store.Retry(ctx, db, tenant, key, nil) },
			"resolve": func() error {
				return store.Resolve(ctx, db, tenant, key, keyrow.Resolution{RecoveryPoint: keyrow.Started}, nil)
			},
		} {
			if err := act(); !errors.Is(err, keyrow.ErrNotFound) {
				t.Errorf("%s %q %q: %v, want ErrNotFound", name, tenant, key, err)
			}
		}
		if freed, err := store.Unlock(ctx, db, tenant, key, nil); freed || err != nil {
			t.Errorf("unlock %q %q: freed %v, %v; want nothing freed, no error (as for any missing key)", tenant, key, freed, err)
		}
	}
	var audited int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM atomicphase_audit`).Scan(&audited); err != nil {
		t.Fatal(err)
	}
	if audited != 0 {
		t.Errorf("%d audit entries, want none for keys that cannot exist", audited)
	}
	if info := inspect(t, db, "acme", "k1"); info.LeaseTakenAt == nil {
		t.Error("the key k1 lost its lease to an action on another key")
	}
}
