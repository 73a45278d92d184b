package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
)

// TestAHoldersStatementsFindTheRowByItsIDOnANewTable: the statements a
// holder sends about its key find the row through the primary key in their
// generic plans, the plans a connection keeps, both on a table created a
// moment ago (no statistics) and on one with a tenant's thousand keys,
// analyzed. When they also named the tenant, the generic plan made on a new
// table scanned the (tenant, idempotency_key) index by the tenant alone: every
// phase commit read every key of the tenant.
func TestAHoldersStatementsFindTheRowByItsIDOnANewTable(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "the plans of a single Postgres; the Citus forms name the tenant (TestCitusEveryPerKeyStatementReachesOneShard)")
	db := pgtest.Pool(t)
	ctx := context.Background()
	h := Holder{Tenant: "acme", ID: uuid.New(), Token: uuid.New(), Point: "started"}
	ttl := 30 * time.Second
	advance, err := AdvanceWrite(h, "charged", []byte(`{}`), ttl)
	if err != nil {
		t.Fatal(err)
	}
	finish, err := FinishWrite(h, []byte(`{}`), keyrow.Response{Status: 201, Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	id, token := uuidArg(h.ID), uuidArg(h.Token)
	statements := []struct {
		name string
		sql  string
		args []any
	}{
		{"advance", advance.sql, advance.args},
		{"finish", finish.sql, finish.args},
		{"release", releaseSQL.plain, keyArgs(false, []any{id, token, "", "", 0, false, h.Tenant})},
		{"adopt", adoptSQL.plain, keyArgs(false, []any{id, token, "d2", "charged", h.Tenant})},
		{"mark call", markCallSQL.plain, keyArgs(false, []any{id, token, ttl, "charge", h.Point, h.Tenant})},
		{"renew", renewSQL, []any{id, token, ttl}},
		{"take resolution", takeResolutionSQL, []any{id, token}},
	}
	check := func(state string) {
		t.Helper()
		for i, s := range statements {
			plan := genericPlan(t, db, fmt.Sprintf("s%d_%s", i, state), s.sql, s.args)
			if !strings.Contains(plan, "idempotency_keys_pkey") || strings.Contains(plan, "idempotency_keys_tenant_key") {
				t.Errorf("%s, %s: the generic plan does not find the row by the primary key:\n%s", s.name, state, plan)
			}
		}
	}
	check("new")
	_, err = db.Exec(ctx, `
INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, request_fingerprint, request_params, finished_at, response_status)
SELECT 'acme', 'k' || g, 'test', '\x00', 'null', now(), 201 FROM generate_series(1, 1000) g`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `ANALYZE idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	check("analyzed")
}

// genericPlan returns the generic plan of sql, prepared as name on a
// connection of db, as EXPLAIN prints it for args, in a transaction rolled
// back.
func genericPlan(t *testing.T, db *pgxpool.Pool, name, sql string, args []any) string {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the transaction only explains
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+sql); err != nil {
		t.Fatalf("prepare %s: %v", name, err)
	}
	// EXECUTE's arguments are literals: EXPLAIN takes no parameters.
	params := make([]string, len(args))
	for i, a := range args {
		switch a := a.(type) {
		case pgtype.UUID:
			params[i] = "'" + uuid.UUID(a.Bytes).String() + "'"
		case string:
			params[i] = "'" + strings.ReplaceAll(a, "'", "''") + "'"
		case []byte: // JSON, which reads as jsonb and as bytea
			params[i] = "'" + strings.ReplaceAll(string(a), "'", "''") + "'"
			if a == nil {
				params[i] = "NULL"
			}
		case time.Duration:
			params[i] = fmt.Sprintf("'%d microseconds'", a.Microseconds())
		case pgtype.Interval:
			params[i] = fmt.Sprintf("'%d microseconds'", a.Microseconds)
		default:
			params[i] = fmt.Sprint(a)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN EXECUTE "+name+"("+strings.Join(params, ", ")+")")
	if err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	if _, err := tx.Exec(ctx, "DEALLOCATE "+name); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
