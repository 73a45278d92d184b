package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// listAll pages through f's keys two at a time and returns them in order.
func listAll(t *testing.T, db store.Querier, f keyrow.ListFilter) []string {
	t.Helper()
	f.Limit = 2
	var keys []string
	for pages := 0; ; pages++ {
		page, err := store.List(context.Background(), db, f)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, keysOf(page.Keys)...)
		if page.Next == "" {
			return keys
		}
		if pages > 20 {
			t.Fatal("listing does not end")
		}
		f.After = page.Next
	}
}

func TestListPagesThroughEveryKeyOnceWithFilters(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	// Created in this order, so newest first is the reverse.
	for i, tk := range [][2]string{{"acme", "order-1"}, {"acme", "order-2"}, {"acme", "refund-1"},
		{"globex", "order-1"}, {"acme", "order-3"}} {
		keyIn(t, db, tk[0], tk[1], "finished")
		age(t, db, tk[0], tk[1], fmt.Sprintf("created_at = now() - interval '%d hours'", 5-i))
	}
	for _, key := range []string{"dead-a", "dead-b", "dead-c"} {
		keyIn(t, db, "acme", key, "dead")
	}
	// Three dead keys that share a last_run_at page by id.
	if _, err := db.Exec(context.Background(), `UPDATE idempotency_keys SET last_run_at = now() - interval '1 hour' WHERE hold = 'dead'`); err != nil {
		t.Fatal(err)
	}
	timePassed(t, db)
	deadByID := listAll(t, db, keyrow.ListFilter{Status: keyrow.StatusDead})

	for _, tc := range []struct {
		name   string
		filter keyrow.ListFilter
		want   []string
	}{
		{"finished, newest first", keyrow.ListFilter{Status: keyrow.StatusFinished}, []string{"order-3", "order-1", "refund-1", "order-2", "order-1"}},
		{"tenant and key prefix", keyrow.ListFilter{Tenant: "acme", KeyPrefix: "order-"}, []string{"order-3", "order-2", "order-1"}},
		{"older than 3h", keyrow.ListFilter{Status: keyrow.StatusFinished, OlderThan: 3 * time.Hour}, []string{"refund-1", "order-2", "order-1"}},
		{"newer than 2h30m", keyrow.ListFilter{Status: keyrow.StatusFinished, NewerThan: 150 * time.Minute}, []string{"order-3", "order-1"}},
		{"another workflow", keyrow.ListFilter{Workflow: "other"}, nil},
		{"all keys", keyrow.ListFilter{}, append([]string{"dead-c", "dead-b", "dead-a"}, "order-3", "order-1", "refund-1", "order-2", "order-1")},
	} {
		if got := listAll(t, db, tc.filter); !slices.Equal(got, tc.want) {
			t.Errorf("%s: listed %q, want %q", tc.name, got, tc.want)
		}
	}
	if slices.Sorted(slices.Values(deadByID)) == nil || len(deadByID) != 3 || deadByID[0] == deadByID[1] || deadByID[1] == deadByID[2] {
		t.Errorf("dead keys sharing a last_run_at listed as %q, want each once", deadByID)
	}
}

// audit returns the audit of the tenant's key, newest first.
func audit(t *testing.T, db store.Querier, tenant, key string) []keyrow.AuditEntry {
	t.Helper()
	entries, err := store.Audit(context.Background(), db, keyrow.AuditFilter{Tenant: tenant, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

func TestResolveRecordsTheResolutionOnlyOnAKeyHeldAsUnknownAtThatPoint(t *testing.T) {
	t.Parallel()
	ctx := store.WithActor(context.Background(), "alice")
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "unknown", "unknown")
	keyIn(t, db, "acme", "dead", "dead")
	happened := keyrow.Resolution{RecoveryPoint: "charged", Happened: true, Output: json.RawMessage(`{"id":"ch_9"}`)}

	stale := happened
	stale.RecoveryPoint = keyrow.Started
	if err := store.Resolve(ctx, db, "acme", "unknown", stale, nil); !errors.Is(err, keyrow.ErrNotUnknown) {
		t.Fatalf("resolve at a recovery point the key left = %v, want ErrNotUnknown", err)
	}
	if err := store.Resolve(ctx, db, "acme", "dead", happened, nil); !errors.Is(err, keyrow.ErrNotUnknown) {
		t.Fatalf("resolve of a dead key = %v, want ErrNotUnknown", err)
	}
	if err := store.Resolve(ctx, db, "acme", "missing", happened, nil); !errors.Is(err, keyrow.ErrNotFound) {
		t.Fatalf("resolve of a missing key = %v, want ErrNotFound", err)
	}
	refused := audit(t, db, "acme", "unknown")
	if len(refused) != 1 || refused[0].Refused == "" || refused[0].Actor != "alice" || string(refused[0].Before) != string(refused[0].After) {
		t.Fatalf("audit of the refused resolution = %+v; want one refusal by alice that changed nothing", refused)
	}

	if err := store.Resolve(ctx, db, "acme", "unknown", happened, nil); err != nil {
		t.Fatal(err)
	}
	info := inspect(t, db, "acme", "unknown")
	if info.Resolution == nil || !info.Resolution.Happened || string(info.Resolution.Output) != `{"id": "ch_9"}` || info.Hold != keyrow.HoldUnknown {
		t.Fatalf("after resolve: resolution %+v, hold %q", info.Resolution, info.Hold)
	}
	entries := audit(t, db, "acme", "unknown")
	if len(entries) != 2 {
		t.Fatalf("audit = %+v, want the refusal and the resolution", entries)
	}
	e := entries[0]
	var before, after struct {
		Hold       string             `json:"hold"`
		Resolution *keyrow.Resolution `json:"resolution"`
	}
	if err := errors.Join(json.Unmarshal(e.Before, &before), json.Unmarshal(e.After, &after)); err != nil {
		t.Fatal(err)
	}
	if e.Actor != "alice" || e.Action != keyrow.ActionResolve || e.Refused != "" || before.Resolution != nil || after.Resolution == nil ||
		after.Hold != "unknown" || time.Since(e.At) > time.Minute {
		t.Fatalf("audit entry = %+v (before %+v, after %+v)", e, before, after)
	}

	// A run takes the resolution once.
	row, err := store.ClaimKey(ctx, db, "acme", "unknown", ttl)
	if err != nil || row == nil || row.Hold != keyrow.HoldUnknown {
		t.Fatalf("claim key = %+v, %v", row, err)
	}
	row.Distributed = pgtest.OnCitus()
	for i, want := range []bool{true, false} {
		r, err := store.TakeResolution(ctx, db, row.Holder())
		if err != nil || (r != nil) != want {
			t.Fatalf("take %d = %+v, %v; want a resolution the first time only", i, r, err)
		}
	}
}

// waitForLock returns once a statement containing fragment waits on a
// row lock in the test's database, and fails the test if the statement's
// caller returns first, on done.
func waitForLock(t *testing.T, db store.Querier, fragment string, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("returned without waiting on the lock: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statement with %q waited on a lock within 30s", fragment)
		}
		var waiting bool
		err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%')`, fragment).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Two operators resolve the same unknown key from the same view of it,
// one saying the call happened, the other that it did not: the second
// waits on the first's row lock, then finds a resolution it did not see.
func TestTwoResolutionsFromOneViewRecordExactlyOne(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "it watches the coordinator's pg_stat_activity for the lock wait, which on Citus happens on a worker")
	for _, tc := range []struct {
		name     string
		withSeen bool
	}{{"given what was seen", true}, {"given nothing", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.Pool(t)
			keyIn(t, db, "acme", "k1", "unknown")
			var seen *keyrow.Seen
			if tc.withSeen {
				s := inspect(t, db, "acme", "k1").Seen()
				seen = &s
			}
			happened := keyrow.Resolution{RecoveryPoint: "charged", Happened: true, Output: json.RawMessage(`{"id":"ch_9"}`)}
			notHappened := keyrow.Resolution{RecoveryPoint: "charged"}

			first, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(ctx) //nolint:errcheck // a no-op after Commit
			if err := store.Resolve(store.WithActor(ctx, "alice"), first, "acme", "k1", happened, seen); err != nil {
				t.Fatal(err)
			}
			second := make(chan error, 1)
			go func() { second <- store.Resolve(store.WithActor(ctx, "bob"), db, "acme", "k1", notHappened, seen) }()
			waitForLock(t, db, "WITH target AS", second)
			if err := first.Commit(ctx); err != nil {
				t.Fatal(err)
			}

			err = <-second
			var changed *keyrow.ChangedError
			if !errors.As(err, &changed) || !errors.Is(err, keyrow.ErrChanged) || errors.Is(err, keyrow.ErrNotUnknown) ||
				changed.Now == nil || !changed.Now.Resolution.Equal(&happened) {
				t.Fatalf("second resolution = %v; want a ChangedError holding the first resolution", err)
			}
			if r := inspect(t, db, "acme", "k1").Resolution; !r.Equal(&happened) {
				t.Fatalf("resolution recorded = %s, want the first (%s)", r, &happened)
			}
			entries := audit(t, db, "acme", "k1")
			if len(entries) != 2 || entries[1].Actor != "alice" || entries[1].Refused != "" ||
				entries[0].Actor != "bob" || entries[0].Action != keyrow.ActionResolve ||
				!strings.Contains(entries[0].Refused, `"ch_9"`) {
				t.Fatalf("audit = %+v; want alice's resolution, then bob's refused", entries)
			}
		})
	}
}

// resolvedAfterSeen returns a database whose key acme/k1 is held as
// unknown, what an operator saw of it, and the resolution another operator
// recorded since.
func resolvedAfterSeen(t *testing.T) (*pgxpool.Pool, keyrow.Seen, keyrow.Resolution) {
	t.Helper()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "unknown")
	before := inspect(t, db, "acme", "k1").Seen()
	happened := keyrow.Resolution{RecoveryPoint: "charged", Happened: true, Output: json.RawMessage(`{"id":"ch_9"}`)}
	if err := store.Resolve(context.Background(), db, "acme", "k1", happened, nil); err != nil {
		t.Fatal(err)
	}
	return db, before, happened
}

func TestResolveReplacesAPendingResolutionOnlyWhenSeenNamesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, before, happened := resolvedAfterSeen(t)
	notHappened := keyrow.Resolution{RecoveryPoint: "charged"}

	// A page loaded before the first resolution, and a call that names
	// none, are refused.
	for _, seen := range []*keyrow.Seen{&before, nil} {
		if err := store.Resolve(ctx, db, "acme", "k1", notHappened, seen); !errors.Is(err, keyrow.ErrChanged) {
			t.Fatalf("resolve over a pending resolution, seen %+v = %v; want ErrChanged", seen, err)
		}
	}
	if r := inspect(t, db, "acme", "k1").Resolution; !r.Equal(&happened) {
		t.Fatalf("resolution = %s, want the first kept", r)
	}
	// A page that showed the pending resolution replaces it.
	after := inspect(t, db, "acme", "k1").Seen()
	if err := store.Resolve(ctx, db, "acme", "k1", notHappened, &after); err != nil {
		t.Fatal(err)
	}
	if r := inspect(t, db, "acme", "k1").Resolution; !r.Equal(&notHappened) {
		t.Fatalf("resolution = %s, want the replacement", r)
	}
	var refusals int
	for _, e := range audit(t, db, "acme", "k1") {
		if e.Refused != "" {
			refusals++
		}
	}
	if refusals != 2 {
		t.Fatalf("%d refusals audited, want 2", refusals)
	}
}

// An Unlock form loaded while a lease had expired is submitted after a new
// run took a ten-minute lease.
func TestUnlockGivenAnExpiredLeaseLeavesTheLeaseANewRunTookAlone(t *testing.T) {
	t.Parallel()
	ctx := store.WithActor(context.Background(), "alice")
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "leased")
	age(t, db, "acme", "k1", `locked_at = now() - interval '1 hour', lock_expires_at = now() - interval '50 minutes'`)
	seen := inspect(t, db, "acme", "k1").Seen()
	run, err := store.ClaimKey(ctx, db, "acme", "k1", 10*time.Minute)
	if err != nil || run == nil {
		t.Fatalf("claim = %+v, %v", run, err)
	}
	leased := inspect(t, db, "acme", "k1")

	freed, err := store.Unlock(ctx, db, "acme", "k1", &seen)
	var changed *keyrow.ChangedError
	if freed || !errors.As(err, &changed) || !strings.Contains(err.Error(), "took the lease again") ||
		changed.Now.LeaseTakenAt == nil || !changed.Now.LeaseTakenAt.Equal(*leased.LeaseTakenAt) {
		t.Fatalf("stale unlock = %v, %v; want refused, naming the new lease", freed, err)
	}
	if now := inspect(t, db, "acme", "k1"); now.LeaseLeft == 0 || !now.LeaseTakenAt.Equal(*leased.LeaseTakenAt) {
		t.Fatalf("after the stale unlock: lease %v left, taken %v; want the new run's lease kept", now.LeaseLeft, now.LeaseTakenAt)
	}
	if err := store.Advance(ctx, db, run.Holder(), "charged", []byte(`{}`), ttl); err != nil {
		t.Fatalf("the new run's write after the stale unlock: %v", err)
	}

	fresh := inspect(t, db, "acme", "k1").Seen()
	if freed, err := store.Unlock(ctx, db, "acme", "k1", &fresh); err != nil || !freed {
		t.Fatalf("unlock of the lease seen = %v, %v; want it freed", freed, err)
	}
	entries := audit(t, db, "acme", "k1")
	if len(entries) != 2 || entries[1].Refused == "" || entries[0].Refused != "" || entries[0].Action != keyrow.ActionUnlock {
		t.Fatalf("audit = %+v; want the refusal, then the unlock", entries)
	}
}

func TestRetryDropsAPendingResolutionOnlyWhenSeenNamesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, before, happened := resolvedAfterSeen(t)
	for _, seen := range []*keyrow.Seen{&before, nil} {
		err := store.Retry(ctx, db, "acme", "k1", seen)
		if !errors.Is(err, keyrow.ErrChanged) || errors.Is(err, keyrow.ErrNotHeld) {
			t.Fatalf("retry over a pending resolution, seen %+v = %v; want ErrChanged", seen, err)
		}
	}
	if now := inspect(t, db, "acme", "k1"); now.Hold != keyrow.HoldUnknown || !now.Resolution.Equal(&happened) {
		t.Fatalf("after refused retries: hold %q, resolution %s; want both kept", now.Hold, now.Resolution)
	}
	after := inspect(t, db, "acme", "k1").Seen()
	if err := store.Retry(ctx, db, "acme", "k1", &after); err != nil {
		t.Fatal(err)
	}
	if now := inspect(t, db, "acme", "k1"); now.Hold != "" || now.Resolution != nil {
		t.Fatalf("after the retry: hold %q, resolution %s; want runnable, the resolution dropped", now.Hold, now.Resolution)
	}
	// The retried key is no longer as seen.
	if err := store.Retry(ctx, db, "acme", "k1", &after); !errors.Is(err, keyrow.ErrChanged) || !errors.Is(err, keyrow.ErrNotHeld) {
		t.Fatalf("second retry from the same view = %v; want ErrChanged and ErrNotHeld", err)
	}
}

func TestSeenSurvivesItsTextForm(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 1, 12, 0, 0, 123456000, time.UTC)
	seen := keyrow.Seen{RecoveryPoint: "charged", Hold: keyrow.HoldUnknown, Attempts: 3, LeaseTakenAt: &at,
		Resolution: &keyrow.Resolution{RecoveryPoint: "charged", Happened: true, Output: json.RawMessage(`{"id": "ch_9"}`)}}
	back, err := keyrow.ParseSeen(seen.String())
	if err != nil || len(seen.Changes(&keyrow.Row{RecoveryPoint: back.RecoveryPoint, Hold: back.Hold, Attempts: back.Attempts,
		LeaseTakenAt: back.LeaseTakenAt, Resolution: back.Resolution})) != 0 {
		t.Fatalf("ParseSeen(%s) = %+v, %v; want what was seen", seen, back, err)
	}
	for _, bad := range []string{"", "not a token", "e30"} {
		if _, err := keyrow.ParseSeen(bad); err == nil {
			t.Errorf("ParseSeen(%q) succeeded, want an error", bad)
		}
	}
}

func TestTakeResolutionIsFencedByTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "unknown")
	if err := store.Resolve(ctx, db, "acme", "k1", keyrow.Resolution{RecoveryPoint: "charged"}, nil); err != nil {
		t.Fatal(err)
	}
	row, err := store.ClaimKey(ctx, db, "acme", "k1", ttl)
	if err != nil || row == nil {
		t.Fatalf("claim key = %+v, %v", row, err)
	}
	if again, err := store.ClaimKey(ctx, db, "acme", "k1", ttl); err != nil || again != nil {
		t.Fatalf("second claim under a live lease = %+v, %v; want none", again, err)
	}
	if r, err := store.TakeResolution(ctx, db, store.Holder{Tenant: "acme", ID: row.ID, Token: [16]byte{1}, Distributed: pgtest.OnCitus()}); err != nil || r != nil {
		t.Fatalf("take with another token = %+v, %v; want nothing", r, err)
	}
	if info := inspect(t, db, "acme", "k1"); info.Resolution == nil || info.Resolution.Happened {
		t.Fatalf("resolution after a foreign take = %+v, want it kept", info.Resolution)
	}
}

func TestBulkRetryPreviewsAndChangesTheSameKeysAndAuditsEach(t *testing.T) {
	t.Parallel()
	ctx := store.WithActor(context.Background(), "bob")
	db := pgtest.Pool(t)
	for _, key := range []string{"dead-1", "dead-2"} {
		keyIn(t, db, "acme", key, "dead")
	}
	keyIn(t, db, "globex", "dead-3", "dead")
	keyIn(t, db, "acme", "unknown-1", "unknown")
	keyIn(t, db, "acme", "finished", "finished")
	acme := keyrow.ListFilter{Tenant: "acme"}

	for _, confirm := range []bool{false, true} {
		want := map[bool]int{false: 2, true: 3}[confirm]
		if n, err := store.BulkPreview(ctx, db, store.BulkRetry, acme, confirm); err != nil || n != want {
			t.Fatalf("preview (confirm unknown %v) = %d, %v; want %d", confirm, n, err, want)
		}
	}
	n, err := store.BulkAct(ctx, db, store.BulkRetry, acme, false)
	if err != nil || n != 2 {
		t.Fatalf("bulk retry = %d, %v; want the 2 dead keys of acme", n, err)
	}
	for key, hold := range map[string]keyrow.Hold{"dead-1": "", "dead-2": "", "unknown-1": keyrow.HoldUnknown} {
		if got := inspect(t, db, "acme", key).Hold; got != hold {
			t.Errorf("%s: hold %q, want %q", key, got, hold)
		}
	}
	if got := inspect(t, db, "globex", "dead-3").Hold; got != keyrow.HoldDead {
		t.Errorf("another tenant's key: hold %q, want it left dead", got)
	}
	for _, key := range []string{"dead-1", "dead-2"} {
		if e := audit(t, db, "acme", key); len(e) != 1 || e[0].Actor != "bob" || e[0].Action != keyrow.ActionRetry {
			t.Errorf("%s: audit %+v, want one retry by bob", key, e)
		}
	}
	if n, err := store.BulkPreview(ctx, db, store.BulkRetry, acme, false); err != nil || n != 0 {
		t.Fatalf("preview after the retry = %d, %v; want 0", n, err)
	}
}

func TestBulkUnlockFreesTheLeasesOfTheSelectedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "leased-1", "leased")
	keyIn(t, db, "acme", "leased-2", "leased")
	keyIn(t, db, "acme", "runnable", "runnable")
	f := keyrow.ListFilter{Status: keyrow.StatusInFlight, KeyPrefix: "leased-"}

	if n, err := store.BulkPreview(ctx, db, store.BulkUnlock, f, false); err != nil || n != 2 {
		t.Fatalf("preview = %d, %v; want 2", n, err)
	}
	if n, err := store.BulkAct(ctx, db, store.BulkUnlock, f, false); err != nil || n != 2 {
		t.Fatalf("bulk unlock = %d, %v; want 2", n, err)
	}
	for _, key := range []string{"leased-1", "leased-2"} {
		if info := inspect(t, db, "acme", key); info.LeaseExpiresAt != nil {
			t.Errorf("%s still leased until %v", key, info.LeaseExpiresAt)
		}
	}
	if _, err := store.BulkAct(ctx, db, store.BulkUnlock, keyrow.ListFilter{After: "x"}, false); err == nil {
		t.Error("bulk action with a cursor succeeded, want an error")
	}
}

func TestCountByWorkflowCountsEachWorkflowsKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "f1", "finished")
	keyIn(t, db, "acme", "d1", "dead")
	keyIn(t, db, "acme", "u1", "unknown")
	if _, err := db.Exec(ctx, `UPDATE idempotency_keys SET workflow = 'other' WHERE idempotency_key = 'u1'`); err != nil {
		t.Fatal(err)
	}
	counts, err := store.CountByWorkflow(ctx, db, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]keyrow.Counts{"test": {Finished: 1, Dead: 1}, "other": {Unknown: 1}}
	if len(counts) != 2 || counts["test"] != want["test"] || counts["other"] != want["other"] {
		t.Fatalf("counts = %+v, want %+v", counts, want)
	}
	oldest, lastHour, err := store.Activity(ctx, db)
	if err != nil || lastHour != 3 || oldest != 0 {
		t.Fatalf("activity = oldest %v, %d in the last hour, %v; want no runnable key and 3", oldest, lastHour, err)
	}
}
