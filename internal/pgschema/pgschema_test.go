package pgschema_test

import (
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/internal/pgschema"
)

func TestQualifyNamesEveryObjectInTheSchemaAndNothingElse(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, sql, want string }{
		{"payments", `SELECT 1 FROM idempotency_keys k WHERE k.idempotency_key = $1`,
			`SELECT 1 FROM "payments".idempotency_keys k WHERE k.idempotency_key = $1`},
		{"payments", `WITH fenced AS (UPDATE idempotency_keys SET x = 1 RETURNING 1) SELECT atomicphase_lease_lost() WHERE NOT EXISTS (SELECT FROM fenced)`,
			`WITH fenced AS (UPDATE "payments".idempotency_keys SET x = 1 RETURNING 1) SELECT "payments".atomicphase_lease_lost() WHERE NOT EXISTS (SELECT FROM fenced)`},
		{"payments", `INSERT INTO atomicphase_audit (actor) SELECT actor FROM atomicphase_status_history, atomicphase_migration`,
			`INSERT INTO "payments".atomicphase_audit (actor) SELECT actor FROM "payments".atomicphase_status_history, "payments".atomicphase_migration`},
		// A literal that is a name is a relation's name; other literals,
		// comments and quoted identifiers are text.
		{"payments", `SELECT to_regclass('idempotency_keys'), 'idempotency_keys'::regclass, 'rows of idempotency_keys'`,
			`SELECT to_regclass('"payments".idempotency_keys'), '"payments".idempotency_keys'::regclass, 'rows of idempotency_keys'`},
		{"payments", "-- the client's idempotency_keys\nCOMMENT ON COLUMN idempotency_keys.id IS 'It''s idempotency_keys.id'; /* idempotency_keys */ SELECT \"idempotency_keys\"",
			"-- the client's idempotency_keys\nCOMMENT ON COLUMN \"payments\".idempotency_keys.id IS 'It''s idempotency_keys.id'; /* idempotency_keys */ SELECT \"idempotency_keys\""},
		// Indexes and constraints are named in their table's schema, but
		// DROP INDEX finds one by the search_path.
		{"payments", `CREATE INDEX IF NOT EXISTS idempotency_keys_held ON idempotency_keys (hold); DROP INDEX IF EXISTS idempotency_keys_finished;`,
			`CREATE INDEX IF NOT EXISTS idempotency_keys_held ON "payments".idempotency_keys (hold); DROP INDEX IF EXISTS "payments".idempotency_keys_finished;`},
		{"Pay'Ments", `SELECT to_regclass('idempotency_keys') FROM idempotency_keys`,
			`SELECT to_regclass('"Pay''Ments".idempotency_keys') FROM "Pay'Ments".idempotency_keys`},
		{"", `SELECT to_regclass('idempotency_keys') FROM idempotency_keys`, `SELECT to_regclass('idempotency_keys') FROM idempotency_keys`},
	} {
		got := pgschema.Qualify(c.name, c.sql)
		if got != c.want {
			t.Errorf("Qualify(%q, %q)\n got %q\nwant %q", c.name, c.sql, got, c.want)
		}
		if twice := pgschema.Qualify(c.name, got); twice != got {
			t.Errorf("qualifying %q again gave %q", got, twice)
		}
	}
}

func TestCheckRefusesWhatCannotNameASchema(t *testing.T) {
	t.Parallel()
	for _, name := range []string{`"payments"`, "pg_payments", "PG_x", strings.Repeat("a", 64), "a\x00b", "a\nb", "\xff"} {
		if err := pgschema.Check(name); err == nil {
			t.Errorf("Check(%q) = nil, want an error", name)
		}
	}
	for _, name := range []string{"", "payments", "Payments", "pay ments", "billing-v2", "émission", strings.Repeat("a", 63)} {
		if err := pgschema.Check(name); err != nil {
			t.Errorf("Check(%q) = %v", name, err)
		}
	}
}
