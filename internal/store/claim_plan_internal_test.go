package store

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// TestAClaimReadsAboutAsManyKeysAsItTakes checks the claim's plan on a long
// backlog: each of its scans walks its index in order and stops after the
// keys it takes, rather than reading and sorting every due key, so that a
// drained key costs as much at 100,000 keys as at 10,000.
func TestAClaimReadsAboutAsManyKeysAsItTakes(t *testing.T) {
	t.Parallel()
	if pgtest.OnCitus() {
		t.Skip("a distributed table is claimed one candidate at a time")
	}
	ctx := context.Background()
	db := pgtest.Pool(t)
	// 5,000 due keys, the oldest three on hold for reconciliation.
	_, err := db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params, last_run_at, hold)
SELECT 'acme', 'k' || i, 'test', '\x00', '{}', now() - interval '1 hour' - i * interval '1 second',
       CASE WHEN i > 4997 THEN 'unknown' END
FROM generate_series(1, 5000) AS i`)
	if err == nil {
		_, err = db.Exec(ctx, `ANALYZE idempotency_keys`)
	}
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []struct{ Plan planNode }
	var text string
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+claimSQL,
		10, time.Minute, time.Duration(0), time.Hour, time.Minute, []string{"test"}, []string{""}, 10).Scan(&text); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(text), &plan); err != nil || len(plan) != 1 {
		t.Fatalf("EXPLAIN's JSON: %v", err)
	}
	root := plan[0].Plan
	if root.ActualRows != 10 {
		t.Fatalf("the claim took %v keys, want 10", root.ActualRows)
	}
	if read := root.keysRead(); read > 30 {
		t.Errorf("the claim read %v keys to take 10 of 5,000 due ones; want about 10:\n%s", read, text)
	}
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON)'s plan.
type planNode struct {
	NodeType      string     `json:"Node Type"`
	Relation      string     `json:"Relation Name"`
	ActualRows    float64    `json:"Actual Rows"`
	ActualLoops   float64    `json:"Actual Loops"`
	RemovedFilter float64    `json:"Rows Removed by Filter"`
	RemovedCheck  float64    `json:"Rows Removed by Index Recheck"`
	Plans         []planNode `json:"Plans"`
}

// keysRead sums the rows the scans of idempotency_keys under n read: those
// they returned and those their filters removed.
func (n planNode) keysRead() float64 {
	var read float64
	if n.Relation == "idempotency_keys" && strings.Contains(n.NodeType, "Scan") {
		read += (n.ActualRows + n.RemovedFilter + n.RemovedCheck) * n.ActualLoops
	}
	for _, c := range n.Plans {
		read += c.keysRead()
	}
	return read
}
