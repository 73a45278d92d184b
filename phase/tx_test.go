package phase_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// effectsWorkflow returns a client and a two-phase workflow whose first
// phase runs use on its transaction as its very first call, then fails when
// the key starts with "fail", and whose second phase answers 201. use writes
// effects for the run's key.
func effectsWorkflow(t *testing.T, db *pgxpool.Pool, use func(ctx context.Context, tx pgx.Tx, key string) error) (*phase.Client, *phase.Workflow[order, struct{}]) {
	t.Helper()
	w, err := phase.NewWorkflow("effects",
		phase.Local("used", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			if err := use(ctx, tx, in.Key); err != nil {
				return phase.Result{}, err
			}
			if strings.HasPrefix(in.Key, "fail") {
				return phase.Result{}, errors.New("the phase fails after its statements")
			}
			return phase.Next(), nil
		}),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			return phase.JSON(201, "ok"), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

// TestEveryWayIntoThePhaseTransactionIsTransactional uses each pgx.Tx method
// as a phase's first call, where the runner has not sent BEGIN yet, and
// checks that what it wrote commits with the phase, and rolls back with it
// when the phase fails.
func TestEveryWayIntoThePhaseTransactionIsTransactional(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "it counts large objects, which belong to the whole database that the Citus tests share")
	insert := `INSERT INTO effects VALUES ($1)`
	for _, tc := range []struct {
		name string
		use  func(ctx context.Context, tx pgx.Tx, key string) error
	}{
		{"Exec", func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, insert, key)
			return err
		}},
		{"Exec with a query exec mode", func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, insert, pgx.QueryExecModeSimpleProtocol, key)
			return err
		}},
		{"Query", func(ctx context.Context, tx pgx.Tx, key string) error {
			rows, err := tx.Query(ctx, `INSERT INTO effects VALUES ($1), ($1 || '-2') RETURNING k`, key)
			if err != nil {
				return err
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			if !slices.Equal(got, []string{key, key + "-2"}) {
				return fmt.Errorf("query returned %q", got)
			}
			_, err = tx.Exec(ctx, `DELETE FROM effects WHERE k = $1`, key+"-2")
			return err
		}},
		{"Query read by hand", func(ctx context.Context, tx pgx.Tx, key string) error {
			rows, err := tx.Query(ctx, `INSERT INTO effects VALUES ($1) RETURNING k`, key)
			if err != nil {
				return err
			}
			defer rows.Close()
			var got string
			for rows.Next() {
				if err := rows.Scan(&got); err != nil {
					return err
				}
			}
			if err := rows.Err(); err != nil || got != key {
				return fmt.Errorf("query returned %q (%v)", got, err)
			}
			// The connection is free again once the rows are read.
			var n int
			return tx.QueryRow(ctx, `SELECT count(*) FROM effects WHERE k = $1`, key).Scan(&n)
		}},
		{"QueryRow", func(ctx context.Context, tx pgx.Tx, key string) error {
			var got string
			if err := tx.QueryRow(ctx, `INSERT INTO effects VALUES ($1) RETURNING k`, key).Scan(&got); err != nil {
				return err
			}
			if got != key {
				return fmt.Errorf("query row returned %q", got)
			}
			return nil
		}},
		{"QueryRow of no rows", func(ctx context.Context, tx pgx.Tx, key string) error {
			var got string
			if err := tx.QueryRow(ctx, `SELECT k FROM effects WHERE k = $1`, key).Scan(&got); !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("query row of nothing = %v, want pgx.ErrNoRows", err)
			}
			_, err := tx.Exec(ctx, insert, key)
			return err
		}},
		{"SendBatch", func(ctx context.Context, tx pgx.Tx, key string) error {
			b := &pgx.Batch{}
			b.Queue(insert, key)
			var n int
			b.Queue(`SELECT count(*) FROM effects WHERE k = $1`, key).QueryRow(func(row pgx.Row) error { return row.Scan(&n) })
			br := tx.SendBatch(ctx, b)
			if _, err := br.Exec(); err != nil {
				return err
			}
			if err := br.Close(); err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("the batch saw %d rows of its own insert", n)
			}
			return nil
		}},
		{"CopyFrom", func(ctx context.Context, tx pgx.Tx, key string) error {
			n, err := tx.CopyFrom(ctx, pgx.Identifier{"effects"}, []string{"k"}, pgx.CopyFromRows([][]any{{key}}))
			if err == nil && n != 1 {
				err = fmt.Errorf("copied %d rows", n)
			}
			return err
		}},
		{"Begin (savepoints)", func(ctx context.Context, tx pgx.Tx, key string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, key+"-undone"); err != nil {
				return err
			}
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
			sp, err = tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, key); err != nil {
				return err
			}
			return sp.Commit(ctx)
		}},
		{"Conn", func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Conn().Exec(ctx, insert, key)
			return err
		}},
		{"Prepare", func(ctx context.Context, tx pgx.Tx, key string) error {
			sd, err := tx.Prepare(ctx, "insert_effect", insert)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, sd.Name, key)
			return err
		}},
		{"LargeObjects", func(ctx context.Context, tx pgx.Tx, key string) error {
			lo := tx.LargeObjects()
			oid, err := lo.Create(ctx, 0)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO effects VALUES ($1), ($2)`, key, fmt.Sprint("lo-", oid))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.Pool(t)
			if _, err := db.Exec(ctx, `CREATE TABLE effects (k text)`); err != nil {
				t.Fatal(err)
			}
			c, w := effectsWorkflow(t, db, tc.use)
			if out, err := w.Run(ctx, c, "acme", "ok", order{}); err != nil || out.Kind != phase.OutcomeNew {
				t.Fatalf("run = %v, %v; want a new run to its response", out, err)
			}
			if _, err := w.Run(ctx, c, "acme", "fail", order{}); err == nil {
				t.Fatal("the failing run succeeded")
			}
			var effects []string
			rows, err := db.Query(ctx, `SELECT k FROM effects WHERE k NOT LIKE 'lo-%' ORDER BY k`)
			if err == nil {
				effects, err = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(effects, []string{"ok"}) {
				t.Errorf("effects %q, want only the successful run's", effects)
			}
			var objects, loRows int
			err = db.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_largeobject_metadata), (SELECT count(*) FROM effects WHERE k LIKE 'lo-%')`).Scan(&objects, &loRows)
			if err != nil {
				t.Fatal(err)
			}
			if objects != loRows {
				t.Errorf("%d large objects, %d recorded: the failed run's must be rolled back", objects, loRows)
			}
			if rp := recoveryPoint(t, db, "fail"); rp != keyrow.Started {
				t.Errorf("failed run's key at %q, want started", rp)
			}
			var open int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&open); err != nil || open != 0 {
				t.Errorf("%d connections left in a transaction (%v)", open, err)
			}
		})
	}
}

func recoveryPoint(t *testing.T, db *pgxpool.Pool, key string) string {
	t.Helper()
	var rp string
	if err := db.QueryRow(context.Background(), `SELECT recovery_point FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&rp); err != nil {
		t.Fatal(err)
	}
	return rp
}

// TestAPhaseThatIgnoresAFailedStatementCommitsNothing checks that a failed
// first statement (before BEGIN ran, or after) leaves no transaction in which
// the phase's later statements could commit.
func TestAPhaseThatIgnoresAFailedStatementCommitsNothing(t *testing.T) {
	t.Parallel()
	for _, failing := range []string{
		`INSERT INTO no_such_table VALUES ($1)`,     // refused when prepared: BEGIN never runs
		`INSERT INTO effects VALUES ($1 || '-dup')`, // fails when run, after BEGIN
	} {
		t.Run(failing, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.Pool(t)
			if _, err := db.Exec(ctx, `CREATE TABLE effects (k text UNIQUE); INSERT INTO effects VALUES ('ok-dup'), ('fail-dup')`); err != nil {
				t.Fatal(err)
			}
			var second error
			c, w := effectsWorkflow(t, db, func(ctx context.Context, tx pgx.Tx, key string) error {
				if _, err := tx.Exec(ctx, failing, key); err == nil {
					return errors.New("the failing statement succeeded")
				}
				_, second = tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, key)
				return nil
			})
			if _, err := w.Run(ctx, c, "acme", "ok", order{}); err == nil {
				t.Fatal("the run committed after a failed statement")
			}
			if second == nil {
				t.Error("a statement after the failed one succeeded")
			}
			var n int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM effects WHERE k = 'ok'`).Scan(&n); err != nil || n != 0 {
				t.Errorf("%d rows of the failed phase persisted (%v)", n, err)
			}
			if rp := recoveryPoint(t, db, "ok"); rp != keyrow.Started {
				t.Errorf("key at %q, want started", rp)
			}
		})
	}
}

// TestPhaseIsolationLevelIsHonoured checks the level a phase's transaction
// runs at, whichever way its first statement begins it.
func TestPhaseIsolationLevelIsHonoured(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	level := func(first func(ctx context.Context, tx pgx.Tx) (string, error)) phase.LocalFunc[order, string] {
		return func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, string]) (phase.Result, error) {
			got, err := first(ctx, tx)
			in.State += got + ";"
			return phase.Next(), err
		}
	}
	queryRow := func(ctx context.Context, tx pgx.Tx) (string, error) {
		var got string
		err := tx.QueryRow(ctx, `SELECT current_setting('transaction_isolation')`).Scan(&got)
		return got, err
	}
	simple := func(ctx context.Context, tx pgx.Tx) (string, error) {
		var got string
		err := tx.QueryRow(ctx, `SELECT current_setting('transaction_isolation')`, pgx.QueryExecModeSimpleProtocol).Scan(&got)
		return got, err
	}
	savepoint := func(ctx context.Context, tx pgx.Tx) (string, error) {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return "", err
		}
		got, err := queryRow(ctx, sp)
		if err != nil {
			return "", err
		}
		return got, sp.Commit(ctx)
	}
	w, err := phase.NewWorkflow("levels",
		phase.Local("default", level(queryRow)),
		phase.Local("serializable", level(queryRow)).Isolation(pgx.Serializable),
		phase.Local("repeatable_simple", level(simple)).Isolation(pgx.RepeatableRead),
		phase.Local("serializable_savepoint", level(savepoint)).Isolation(pgx.Serializable),
		phase.Local("answer", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, string]) (phase.Result, error) {
			return phase.JSON(200, in.State), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
	if err != nil {
		t.Fatal(err)
	}
	out, err := w.Run(context.Background(), c, "acme", "k1", order{})
	if err != nil {
		t.Fatal(err)
	}
	want := `"read committed;serializable;repeatable read;serializable;"` + "\n"
	if string(out.Response.Body) != want {
		t.Fatalf("levels %s, want %s", out.Response.Body, want)
	}
}

// TestLocalPhaseCostsItsStatementsPlusOneRoundTrip pins what a local phase
// sends: BEGIN with its first statement, the fenced write with COMMIT (in
// front of the next local phase's first statement, or alone before it
// when that phase sends nothing), and the fenced write alone when the
// phase sends nothing.
func TestLocalPhaseCostsItsStatementsPlusOneRoundTrip(t *testing.T) {
	t.Parallel()
	db, counter := pgtest.CountingPool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // one connection, so statements are prepared once
	})
	if _, err := db.Exec(context.Background(), `CREATE TABLE counts (k text)`); err != nil {
		t.Fatal(err)
	}
	insert := func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) error {
		_, err := tx.Exec(ctx, `INSERT INTO counts VALUES ($1)`, in.Key)
		return err
	}
	w, err := phase.NewWorkflow("count",
		phase.Local("one", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			return phase.Next(), insert(ctx, tx, in)
		}),
		phase.Local("nothing", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			return phase.Next(), nil
		}),
		phase.Local("two", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			return phase.JSON(201, "ok"), insert(ctx, tx, in)
		}))
	if err != nil {
		t.Fatal(err)
	}
	rn, err := phase.NewClient(db, nil, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Run(ctx, rn, "acme", "warm-up", order{}); err != nil {
		t.Fatal(err)
	}
	counter.Reset()
	if _, err := w.Run(ctx, rn, "acme", "k1", order{}); err != nil {
		t.Fatal(err)
	}
	// acquire (1); "one": BEGIN with the INSERT (1 round trip, 2
	// statements), its fenced write and COMMIT held back for "nothing",
	// which sends them before its own fenced write (1 and 2, then 1 and
	// 1); "two": BEGIN with the INSERT, the finish with COMMIT (2 and 4).
	if counter.RoundTrips() != 1+1+2+2 || counter.Statements() != 1+2+3+4 {
		t.Fatalf("%d round trips, %d statements; want 6 and 10: %q", counter.RoundTrips(), counter.Statements(), counter.SQL())
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM counts WHERE k = 'k1'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d rows (%v), want 2", n, err)
	}
	counter.Reset()
	if out, err := w.Run(ctx, rn, "acme", "k1", order{}); err != nil || out.Kind != phase.OutcomeReplayed {
		t.Fatalf("replay: %v %v", out, err)
	}
	if counter.RoundTrips() != 1 || counter.Statements() != 1 {
		t.Fatalf("replay cost %d round trips, %d statements; want 1", counter.RoundTrips(), counter.Statements())
	}
}

// TestForeignCallAfterACommitCostsNoRoundTrip pins what a Repeatable
// foreign phase sends: the call right after the commit of the phase before
// it (or the acquire) needs no renewal, the commit having proved the lease by the
// database clock; a run that stalls longer than store.ProofWindow before
// its call, or whose phase before it ran longer than that (the advance
// extends the lease from its transaction's start), renews first.
func TestForeignCallAfterACommitCostsNoRoundTrip(t *testing.T) {
	t.Parallel()
	db, counter := pgtest.CountingPool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // one connection, so statements are prepared once
	})
	const ttl = 3 * time.Second // proofs count for a second
	var stall, slow atomic.Bool
	call := func(ctx context.Context, in *phase.Input[order, struct{}]) (string, error) {
		return in.DownstreamKey(), nil
	}
	record := func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], _ string) (phase.Result, error) {
		return phase.Next(), nil
	}
	w, err := phase.NewWorkflow("calls",
		phase.Foreign("first", call, record).Repeatable(),
		phase.Local("between", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			_, err := tx.Exec(ctx, `SELECT 1`)
			if slow.Load() {
				// The advance extends the lease from the transaction's
				// start, which this delay leaves behind.
				time.Sleep(store.ProofWindow(ttl) + 100*time.Millisecond)
			}
			return phase.Next(), err
		}),
		phase.Foreign("second", call, func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}], _ string) (phase.Result, error) {
			return phase.JSON(201, "ok"), nil
		}).Repeatable())
	if err != nil {
		t.Fatal(err)
	}
	pause := phase.InjectorFunc(func(ctx context.Context, at phase.Point) error {
		if stall.Load() && at == (phase.Point{Phase: "second", Stage: phase.BeforeCall}) {
			time.Sleep(store.ProofWindow(ttl) + 100*time.Millisecond)
		}
		return nil
	})
	rn, err := phase.NewClient(db, &phase.Config{LeaseTTL: ttl, Hooks: []phase.Hook{pause}}, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Run(ctx, rn, "acme", "warm-up", order{}); err != nil {
		t.Fatal(err)
	}
	renewals := func() (n int) {
		for _, q := range counter.SQL() {
			if strings.Contains(q, "SET lock_expires_at = now() + $3::interval") && !strings.Contains(q, "recovery_point") {
				n++
			}
		}
		return n
	}
	counter.Reset()
	if _, err := w.Run(ctx, rn, "acme", "k1", order{}); err != nil {
		t.Fatal(err)
	}
	// acquire (1); "first": its record, the fenced write alone (1);
	// "between": BEGIN with the SELECT, the fenced write with COMMIT (2);
	// "second": its record and finish alone (1). No renewal.
	if counter.RoundTrips() != 1+1+2+1 || renewals() != 0 {
		t.Fatalf("%d round trips, %d renewals; want 5 and none: %q", counter.RoundTrips(), renewals(), counter.SQL())
	}
	stall.Store(true)
	counter.Reset()
	if _, err := w.Run(ctx, rn, "acme", "k2", order{}); err != nil {
		t.Fatal(err)
	}
	if counter.RoundTrips() != 1+1+2+1+1 || renewals() != 1 {
		t.Fatalf("after a stall before the second call: %d round trips, %d renewals; want 6 and 1: %q", counter.RoundTrips(), renewals(), counter.SQL())
	}
	stall.Store(false)
	slow.Store(true)
	counter.Reset()
	if _, err := w.Run(ctx, rn, "acme", "k3", order{}); err != nil {
		t.Fatal(err)
	}
	if renewals() != 1 {
		t.Fatalf("after a slow phase before the second call: %d renewals, want 1: %q", renewals(), counter.SQL())
	}
}

// TestLostLeaseStopsAPhaseThatSentNothing takes the key over while a phase
// that sends no statement runs: its fenced write, sent alone, must change
// nothing.
func TestLostLeaseStopsAPhaseThatSentNothing(t *testing.T) {
	t.Parallel()
	pgtest.SkipOnCitus(t, "it steals the lease with an UPDATE calling gen_random_uuid(), which Citus refuses; the Citus route's pair matrix covers takeovers")
	ctx := context.Background()
	db := pgtest.Pool(t)
	w, err := phase.NewWorkflow("idle",
		phase.Local("noted", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{ N int }]) (phase.Result, error) {
			_, err := db.Exec(ctx, `UPDATE idempotency_keys SET lock_token = gen_random_uuid() WHERE id = $1`, in.ID)
			in.State.N = 1
			return phase.Next(), err
		}),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{ N int }]) (phase.Result, error) {
			return phase.JSON(200, "ok"), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Run(ctx, c, "acme", "k1", order{}); !errors.Is(err, keyrow.ErrLeaseLost) {
		t.Fatalf("run = %v, want ErrLeaseLost", err)
	}
	var state string
	if err := db.QueryRow(ctx, `SELECT recovery_point || ' ' || phase_state::text FROM idempotency_keys`).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != "started null" {
		t.Fatalf("key row %q after the lost lease, want it untouched", state)
	}
}
