package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// TestEveryStatementReachesTheTablesOfItsSchema sends each of the store's
// statements through a Schema's Querier, and a lease's write in a batch on
// a connection of its own, as the phase runner does, with the tables in a
// schema that the connection's search_path does not find: a statement left
// unqualified fails with "relation does not exist".
func TestEveryStatementReachesTheTablesOfItsSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.SchemaPool(t, "keys")
	s, err := store.NewSchema("keys")
	if err != nil {
		t.Fatal(err)
	}
	q := s.Querier(db)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	ttl := 30 * time.Second
	req := store.Request{Tenant: "acme", Key: "k1", Workflow: "orders", Definition: "d1",
		Fingerprint: [32]byte{1}, Params: []byte(`{"amount":1}`), TTL: ttl}

	outcome, row, err := store.Acquire(ctx, q, req)
	if err != nil || outcome != store.New {
		t.Fatalf("Acquire: %v, %v; want new", outcome, err)
	}
	if out, _, err := store.Acquire(ctx, q, req); err != nil || out != store.Held {
		t.Fatalf("Acquire while held: %v, %v; want held", out, err)
	}
	distributed, err := store.IsDistributed(ctx, q)
	must("IsDistributed", err)
	if distributed {
		t.Fatal("IsDistributed: true on a single Postgres")
	}
	h := row.Holder()
	_, err = store.Renew(ctx, q, h, ttl)
	must("Renew", err)
	lease := store.NewLease(h, ttl)
	must("Lease.Renew", lease.Renew(ctx, q))
	w, err := lease.Advance(keyrow.Started, "charged", []byte(`{"n":1}`))
	must("Advance", err)
	queued := w.In(s).QueuedQuery()
	must("advance in a batch", db.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{&queued}}).Close())
	must("Adopt", store.Adopt(ctx, q, h, "d1", "charged"))
	r, err := store.TakeResolution(ctx, q, h)
	if err != nil || r != nil {
		t.Fatalf("TakeResolution: %v, %v; want none", r, err)
	}
	must("Release", store.Release(ctx, q, h, "boom", "", store.EndedFailed, false))

	outcome, row, err = store.Acquire(ctx, q, req)
	if err != nil || outcome != store.Resumed || row.RecoveryPoint != "charged" {
		t.Fatalf("Acquire after release: %v, %+v, %v; want resumed at charged", outcome, row, err)
	}
	must("Finish", store.Finish(ctx, q, row.Holder(), nil, keyrow.Response{Status: 201, Body: []byte(`{}`)}))
	if out, got, err := store.Acquire(ctx, q, req); err != nil || out != store.Replay || got.Response.Status != 201 {
		t.Fatalf("Acquire after finish: %v, %v; want a replay", out, err)
	}

	// A second key, for the completer and operators: claimed, given up on,
	// retried, unlocked and resolved.
	req.Key = "k2"
	_, row2, err := store.Acquire(ctx, q, req)
	must("Acquire k2", err)
	must("Release k2", store.Release(ctx, q, row2.Holder(), "timeout", keyrow.HoldUnknown, store.EndedIdle, false))
	must("Resolve", store.Resolve(store.WithActor(ctx, "ops"), q, "acme", "k2",
		keyrow.Resolution{RecoveryPoint: keyrow.Started, Happened: false}, nil))
	claimed, err := store.ClaimKey(ctx, q, "acme", "k2", ttl)
	if err != nil || claimed == nil {
		t.Fatalf("ClaimKey: %v, %v", claimed, err)
	}
	if r, err := store.TakeResolution(ctx, q, claimed.Holder()); err != nil || r == nil {
		t.Fatalf("TakeResolution: %v, %v; want the operator's", r, err)
	}
	freed, err := store.Unlock(ctx, q, "acme", "k2", nil)
	if err != nil || !freed {
		t.Fatalf("Unlock: %v, %v", freed, err)
	}
	must("Retry the unknown key", store.Retry(ctx, q, "acme", "k2", nil))
	rows, err := store.Claim(ctx, q, store.ClaimParams{Workflows: []string{"orders"}, Definitions: []string{"d1"},
		Limit: 10, StuckAfter: -1, TTL: ttl})
	if err != nil || len(rows) != 1 {
		t.Fatalf("Claim: %d keys, %v; want k2", len(rows), err)
	}
	must("Release k2 as dead", store.Release(ctx, q, rows[0].Holder(), "gave up", keyrow.HoldDead, store.EndedFailed, false))
	_, err = store.Bury(ctx, q, []string{"orders"}, []string{"d1"}, 1, 0)
	must("Bury", err)
	must("Retry the dead key", store.Retry(ctx, q, "acme", "k2", nil))
	_, err = store.BulkPreview(ctx, q, store.BulkUnlock, keyrow.ListFilter{}, false)
	must("BulkPreview", err)
	_, err = store.BulkAct(ctx, q, store.BulkUnlock, keyrow.ListFilter{}, false)
	must("BulkAct", err)

	// What operators read.
	info, err := store.Inspect(ctx, q, "acme", "k1")
	if err != nil || info.RecoveryPoint != keyrow.Finished {
		t.Fatalf("Inspect: %+v, %v", info, err)
	}
	_, err = store.Fingerprint(ctx, q, "acme", "k1")
	must("Fingerprint", err)
	page, err := store.List(ctx, q, keyrow.ListFilter{Workflow: "orders"})
	if err != nil || len(page.Keys) != 2 {
		t.Fatalf("List: %d keys, %v; want 2", len(page.Keys), err)
	}
	n, err := store.CountMatching(ctx, q, keyrow.ListFilter{Status: keyrow.StatusFinished}, 10)
	if err != nil || n != 1 {
		t.Fatalf("CountMatching: %d, %v; want 1", n, err)
	}
	counts, err := store.Count(ctx, q, time.Minute)
	if err != nil || counts.Finished != 1 || counts.Unfinished() != 1 {
		t.Fatalf("Count: %+v, %v", counts, err)
	}
	_, err = store.CountDefinitions(ctx, q)
	must("CountDefinitions", err)
	_, _, err = store.Activity(ctx, q)
	must("Activity", err)
	_, err = store.Minutes(ctx, q, time.Hour, []string{"orders"})
	must("Minutes", err)
	audit, err := store.Audit(ctx, q, keyrow.AuditFilter{Tenant: "acme", Key: "k2"})
	if err != nil || len(audit) < 3 {
		t.Fatalf("Audit: %d entries, %v; want the resolve, the unlock and the retries", len(audit), err)
	}
	recorded, err := store.RecordHistory(ctx, q, []string{"orders"}, time.Minute)
	if err != nil || recorded == 0 {
		t.Fatalf("RecordHistory: %d, %v", recorded, err)
	}
	minutes, err := store.History(ctx, q, time.Hour)
	if err != nil || len(minutes) == 0 {
		t.Fatalf("History: %v, %v", minutes, err)
	}
	_, err = store.TrimHistory(ctx, q)
	must("TrimHistory", err)

	// The reaper.
	_, _, err = store.ReapCandidates(ctx, q, "orders", time.Hour)
	must("ReapCandidates", err)
	workflows, err := store.FinishedWorkflows(ctx, q)
	if err != nil || len(workflows) != 1 {
		t.Fatalf("FinishedWorkflows: %v, %v", workflows, err)
	}
	_, err = store.Expire(ctx, q, "orders", time.Hour, 10, false)
	must("Expire", err)
	_, err = db.Exec(ctx, `UPDATE keys.idempotency_keys SET finished_at = now() - interval '2 hours', created_at = now() - interval '2 hours', retain_for = NULL WHERE idempotency_key = 'k1'`)
	must("age k1", err)
	reaped, err := store.Reap(ctx, q, "orders", time.Hour, 10, false)
	if err != nil || reaped != 1 {
		t.Fatalf("Reap: %d, %v; want k1", reaped, err)
	}
	if _, err := store.Inspect(ctx, q, "acme", "k1"); !errors.Is(err, keyrow.ErrNotFound) {
		t.Fatalf("Inspect of a reaped key: %v", err)
	}
}

// TestTheSearchPathsSchemaSendsEveryStatementAsWritten: without a schema
// the store's Querier is the one it was given, so every statement goes out
// byte for byte as written, with nothing in between.
func TestTheSearchPathsSchemaSendsEveryStatementAsWritten(t *testing.T) {
	t.Parallel()
	s, err := store.NewSchema("")
	if err != nil || s != nil {
		t.Fatalf("NewSchema(\"\"): %v, %v; want nil", s, err)
	}
	db := pgtest.Pool(t)
	if q := s.Querier(db); q != store.Querier(db) {
		t.Fatalf("Querier of the search_path's schema is %T, want the pool itself", q)
	}
	if got := s.SQL("SELECT FROM idempotency_keys"); got != "SELECT FROM idempotency_keys" {
		t.Fatalf("SQL = %q", got)
	}
	if _, err := store.NewSchema("pg_keys"); err == nil {
		t.Fatal("NewSchema(pg_keys): no error")
	}
}
