package store

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// TestAClaimReadsAboutAsManyKeysAsItTakes checks the claim's plan on a long
// backlog: it reads the watch in order and stops after about twice the
// keys it takes, and reads their rows by the primary key, rather than
// reading and sorting every due key, so that a drained key costs as much
// at 100,000 keys as at 10,000.
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
		err = walkUp(ctx, db, time.Minute)
	}
	if err == nil {
		_, err = db.Exec(ctx, `ANALYZE idempotency_keys; ANALYZE atomicphase_watch`)
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
		10, time.Minute, time.Duration(0), time.Hour, time.Minute, []string{"test"}, []string{""}, 10,
		candidates(10), laterLook).Scan(&text); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(text), &plan); err != nil || len(plan) != 1 {
		t.Fatalf("EXPLAIN's JSON: %v", err)
	}
	root := plan[0].Plan
	if root.ActualRows != 10 {
		t.Fatalf("the claim took %v keys, want 10", root.ActualRows)
	}
	// It reads twice as many candidates as it takes, each of them up to
	// three times (judged, locked, moved): at most 70 rows of each table,
	// and never more for a longer backlog.
	for _, table := range []string{"idempotency_keys", "atomicphase_watch"} {
		if read := root.rowsRead(table); read > 70 {
			t.Errorf("the claim read %v rows of %s to take 10 of 5,000 due keys; want at most 70:\n%s", read, table, text)
		}
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

// rowsRead sums the rows the scans of table under n read: those they
// returned and those their filters removed.
func (n planNode) rowsRead(table string) float64 {
	var read float64
	if n.Relation == table && strings.Contains(n.NodeType, "Scan") {
		read += (n.ActualRows + n.RemovedFilter + n.RemovedCheck) * n.ActualLoops
	}
	for _, c := range n.Plans {
		read += c.rowsRead(table)
	}
	return read
}

// TestCitusTheScanByShardProposesTheKeysTheScanOfEveryShardDoes: the scan
// a claim falls back on while a node is unreachable, each shard on its
// own, proposes the due keys the scan over every shard proposes, the
// longest idle first, within the limit.
func TestCitusTheScanByShardProposesTheKeysTheScanOfEveryShardDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.CitusPool(t, nil)
	// 60 keys over 30 tenants: due but for every third (run lately), one
	// on hold for reconciliation, one dead, one out of attempts.
	_, err := db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params, last_run_at, hold, failures)
SELECT 't' || i % 30, 'k' || i, 'test', '\x00', '{}',
       now() - CASE WHEN i % 3 = 0 THEN interval '1 second' ELSE interval '1 hour' + i * interval '1 second' END,
       CASE i WHEN 1 THEN 'unknown' WHEN 2 THEN 'dead' END, CASE WHEN i = 4 THEN 5 ELSE 0 END
FROM generate_series(1, 60) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{100, 7} {
		args := []any{limit, time.Minute, time.Duration(0), time.Hour, []string{"test"}, []string{""}, 5}
		rows, err := db.Query(ctx, dueCandidatesSQL, args...)
		if err != nil {
			t.Fatal(err)
		}
		want, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
			var c candidate
			return c, r.Scan(&c.tenant, &c.id)
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := dueCandidatesByShard(ctx, db, limit, args)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) != min(limit, 38) || !slices.Equal(got, want) {
			t.Errorf("limit %d: the scan by shard proposed %v; the scan of every shard %v (38 due)", limit, got, want)
		}
	}
}
