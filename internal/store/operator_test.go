package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

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
	deadByID := listAll(t, db, keyrow.ListFilter{State: keyrow.StateDead})

	for _, tc := range []struct {
		name   string
		filter keyrow.ListFilter
		want   []string
	}{
		{"finished, newest first", keyrow.ListFilter{State: keyrow.StateFinished}, []string{"order-3", "order-1", "refund-1", "order-2", "order-1"}},
		{"tenant and key prefix", keyrow.ListFilter{Tenant: "acme", KeyPrefix: "order-"}, []string{"order-3", "order-2", "order-1"}},
		{"older than 3h", keyrow.ListFilter{State: keyrow.StateFinished, OlderThan: 3 * time.Hour}, []string{"refund-1", "order-2", "order-1"}},
		{"newer than 2h30m", keyrow.ListFilter{State: keyrow.StateFinished, NewerThan: 150 * time.Minute}, []string{"order-3", "order-1"}},
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
	entries, err := store.Audit(context.Background(), db, store.AuditFilter{Tenant: tenant, Key: key})
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
	if err := store.Resolve(ctx, db, "acme", "unknown", stale); !errors.Is(err, keyrow.ErrNotUnknown) {
		t.Fatalf("resolve at a recovery point the key left = %v, want ErrNotUnknown", err)
	}
	if err := store.Resolve(ctx, db, "acme", "dead", happened); !errors.Is(err, keyrow.ErrNotUnknown) {
		t.Fatalf("resolve of a dead key = %v, want ErrNotUnknown", err)
	}
	if err := store.Resolve(ctx, db, "acme", "missing", happened); !errors.Is(err, keyrow.ErrNotFound) {
		t.Fatalf("resolve of a missing key = %v, want ErrNotFound", err)
	}
	if n := len(audit(t, db, "acme", "unknown")); n != 0 {
		t.Fatalf("refused resolutions left %d audit entries", n)
	}

	if err := store.Resolve(ctx, db, "acme", "unknown", happened); err != nil {
		t.Fatal(err)
	}
	info := inspect(t, db, "acme", "unknown")
	if info.Resolution == nil || !info.Resolution.Happened || string(info.Resolution.Output) != `{"id": "ch_9"}` || info.Hold != keyrow.HoldUnknown {
		t.Fatalf("after resolve: resolution %+v, hold %q", info.Resolution, info.Hold)
	}
	entries := audit(t, db, "acme", "unknown")
	if len(entries) != 1 {
		t.Fatalf("audit = %+v, want one entry", entries)
	}
	e := entries[0]
	var before, after struct {
		Hold       string             `json:"hold"`
		Resolution *keyrow.Resolution `json:"resolution"`
	}
	if err := errors.Join(json.Unmarshal(e.Before, &before), json.Unmarshal(e.After, &after)); err != nil {
		t.Fatal(err)
	}
	if e.Actor != "alice" || e.Action != keyrow.ActionResolve || before.Resolution != nil || after.Resolution == nil ||
		after.Hold != "unknown" || time.Since(e.At) > time.Minute {
		t.Fatalf("audit entry = %+v (before %+v, after %+v)", e, before, after)
	}

	// A run takes the resolution once.
	row, err := store.ClaimKey(ctx, db, "acme", "unknown", ttl)
	if err != nil || row == nil || row.Hold != keyrow.HoldUnknown {
		t.Fatalf("claim key = %+v, %v", row, err)
	}
	for i, want := range []bool{true, false} {
		r, err := store.TakeResolution(ctx, db, row.Holder())
		if err != nil || (r != nil) != want {
			t.Fatalf("take %d = %+v, %v; want a resolution the first time only", i, r, err)
		}
	}
}

func TestTakeResolutionIsFencedByTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	keyIn(t, db, "acme", "k1", "unknown")
	if err := store.Resolve(ctx, db, "acme", "k1", keyrow.Resolution{RecoveryPoint: "charged"}); err != nil {
		t.Fatal(err)
	}
	row, err := store.ClaimKey(ctx, db, "acme", "k1", ttl)
	if err != nil || row == nil {
		t.Fatalf("claim key = %+v, %v", row, err)
	}
	if again, err := store.ClaimKey(ctx, db, "acme", "k1", ttl); err != nil || again != nil {
		t.Fatalf("second claim under a live lease = %+v, %v; want none", again, err)
	}
	if r, err := store.TakeResolution(ctx, db, store.Holder{Tenant: "acme", ID: row.ID, Token: [16]byte{1}}); err != nil || r != nil {
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
	f := keyrow.ListFilter{State: keyrow.StateInFlight, KeyPrefix: "leased-"}

	if n, err := store.BulkPreview(ctx, db, store.BulkUnlock, f, false); err != nil || n != 2 {
		t.Fatalf("preview = %d, %v; want 2", n, err)
	}
	if n, err := store.BulkAct(ctx, db, store.BulkUnlock, f, false); err != nil || n != 2 {
		t.Fatalf("bulk unlock = %d, %v; want 2", n, err)
	}
	for _, key := range []string{"leased-1", "leased-2"} {
		if info := inspect(t, db, "acme", key); info.LockExpiresAt != nil {
			t.Errorf("%s still leased until %v", key, info.LockExpiresAt)
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
