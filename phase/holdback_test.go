package phase_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

// chain is a three-phase workflow for the tests of commits held back to
// travel with the next phase's first statement: "first" and "second" each
// insert a row named after themselves and the key, "third" inserts its row
// and answers 201. before, when set, runs at the start of "second", before
// it sends anything; it may fail the phase. runs counts the runs of each
// phase's Go code.
type chain struct {
	db      *pgxpool.Pool
	counter *pgtest.StatementCounter
	w       *phase.Workflow[order, struct{}]
	c       *phase.Client
	before  func(ctx context.Context, key string) error
	runs    map[string]*atomic.Int32
	events  *phasetest.Events
}

// phaseWrapperFunc adapts a function to a PhaseWrapper.
type phaseWrapperFunc func(ctx context.Context, info *phase.PhaseInfo, next func(context.Context) error) error

func (phaseWrapperFunc) IsHook() bool { return true }

func (f phaseWrapperFunc) WrapPhase(ctx context.Context, info *phase.PhaseInfo, next func(context.Context) error) error {
	return f(ctx, info, next)
}

// kindOf names an outcome for a failure message.
func kindOf(out *phase.Outcome) string {
	if out == nil {
		return "no outcome"
	}
	return string(out.Kind)
}

func newChain(t *testing.T, cfg *phase.Config) *chain {
	t.Helper()
	return newChainOn(t, pgtest.PoolWith, cfg)
}

// newChainOn is newChain on a pool that poolWith makes: on Citus the
// chained table is distributed by tenant, co-located with the keys.
func newChainOn(t *testing.T, poolWith func(testing.TB, func(*pgxpool.Config)) *pgxpool.Pool, cfg *phase.Config) *chain {
	t.Helper()
	counter := &pgtest.StatementCounter{}
	db := poolWith(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = counter
		cfg.MaxConns = 2 // the phases' connection, and one for the test's own statements
	})
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE TABLE chained (tenant text NOT NULL, k text NOT NULL, PRIMARY KEY (tenant, k))`); err != nil {
		t.Fatal(err)
	}
	var citus bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&citus); err != nil {
		t.Fatal(err)
	}
	if citus {
		if _, err := db.Exec(ctx, `SELECT create_distributed_table('chained', 'tenant', colocate_with => 'idempotency_keys')`); err != nil {
			t.Fatal(err)
		}
	}
	ch := &chain{db: db, counter: counter, runs: map[string]*atomic.Int32{}, events: &phasetest.Events{}}
	insert := func(name string, res phase.Result) phase.LocalFunc[order, struct{}] {
		ch.runs[name] = &atomic.Int32{}
		return func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			ch.runs[name].Add(1)
			if name == "second" && ch.before != nil {
				if err := ch.before(ctx, in.Key); err != nil {
					return phase.Result{}, err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO chained VALUES ($1, $2)`, in.Tenant, name+"/"+in.Key)
			return res, err
		}
	}
	w, err := phase.NewWorkflow("chain",
		phase.Local("first", insert("first", phase.Next())),
		phase.Local("second", insert("second", phase.Next())),
		phase.Local("third", insert("third", phase.JSON(201, "ok"))))
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &phase.Config{}
	}
	cfg.Logger = quiet
	cfg.Hooks = append(cfg.Hooks, ch.events)
	c, err := phase.NewClient(db, cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	ch.w, ch.c = w, c
	// Prepares the statements on the connection, so that the runs the
	// tests count send no Parse of their own.
	if _, err := w.Run(context.Background(), c, "acme", "warm-up", order{}); err != nil {
		t.Fatal(err)
	}
	return ch
}

// rows returns which phases' rows for key were committed.
func (ch *chain) rows(t *testing.T, key string) string {
	t.Helper()
	var got []string
	for _, name := range []string{"first", "second", "third"} {
		var n int
		if err := ch.db.QueryRow(context.Background(), `SELECT count(*) FROM chained WHERE k = $1`, name+"/"+key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			got = append(got, name)
		}
	}
	return strings.Join(got, ",")
}

// TestALocalPhaseCommitTravelsWithTheNextPhasesFirstStatement pins the
// round trips of three local phases of one statement each: acquire; BEGIN
// with the first phase's statement; its advance and COMMIT AND CHAIN (which
// commits and begins the second phase's transaction) with the second
// phase's statement, and the same again into the third; the finish with
// COMMIT. Five round trips for eleven statements.
func TestALocalPhaseCommitTravelsWithTheNextPhasesFirstStatement(t *testing.T) {
	t.Parallel()
	for _, route := range pgtest.Routes() {
		t.Run(route.Name, func(t *testing.T) {
			t.Parallel()
			ch := newChainOn(t, route.PoolWith, nil)
			ch.counter.Reset()
			out, err := ch.w.Run(context.Background(), ch.c, "acme", "k1", order{})
			if err != nil || out.Kind != phase.OutcomeNew {
				t.Fatalf("run: %v, %v", kindOf(out), err)
			}
			if ch.counter.RoundTrips() != 5 || ch.counter.Statements() != 11 {
				t.Fatalf("%d round trips, %d statements; want 5 and 11: %q", ch.counter.RoundTrips(), ch.counter.Statements(), ch.counter.SQL())
			}
			if got := transactionControl(ch.counter.SQL()); got != "begin,COMMIT AND CHAIN,COMMIT AND CHAIN,COMMIT" {
				t.Fatalf("transaction control statements %s; want begin,COMMIT AND CHAIN,COMMIT AND CHAIN,COMMIT", got)
			}
			if got := ch.rows(t, "k1"); got != "first,second,third" {
				t.Fatalf("committed rows of %s; want all three", got)
			}
			var committed []string
			for _, ev := range ch.events.Of("k1") {
				if ev.Kind == keyrow.EventPhaseCommitted || ev.Kind == keyrow.EventFinished {
					committed = append(committed, ev.Phase)
				}
			}
			if got := strings.Join(committed, ","); got != "first,second,third" {
				t.Fatalf("events of committed phases: %s; want first,second,third", got)
			}
		})
	}
}

// TestAPhaseWrapperSeesEachCommitInItsPhase: with a PhaseWrapper, whose
// phase includes its commit, no commit is held back.
func TestAPhaseWrapperSeesEachCommitInItsPhase(t *testing.T) {
	t.Parallel()
	var wrapped atomic.Int32
	ch := newChain(t, &phase.Config{Hooks: []phase.Hook{phaseWrapperFunc(func(ctx context.Context, info *phase.PhaseInfo, next func(context.Context) error) error {
		wrapped.Add(1)
		return next(ctx)
	})}})
	ch.counter.Reset()
	if _, err := ch.w.Run(context.Background(), ch.c, "acme", "k1", order{}); err != nil {
		t.Fatal(err)
	}
	if ch.counter.RoundTrips() != 7 || wrapped.Load() != 3+3 {
		t.Fatalf("%d round trips, %d phases wrapped; want 7 and 3 (and 3 in the warm-up)", ch.counter.RoundTrips(), wrapped.Load())
	}
}

// TestALostLeaseFoundByAHeldBackCommitRunsNothingOfTheNextPhase takes the
// key over while the second phase's Go code runs, before the first phase's
// commit was sent: the fence stops that commit, the second phase's
// statement never runs, and the run reports the lease lost having
// committed nothing.
func TestALostLeaseFoundByAHeldBackCommitRunsNothingOfTheNextPhase(t *testing.T) {
	t.Parallel()
	for _, route := range pgtest.Routes() {
		t.Run(route.Name, func(t *testing.T) {
			t.Parallel()
			ch := newChainOn(t, route.PoolWith, nil)
			ch.before = func(ctx context.Context, key string) error {
				_, err := ch.db.Exec(ctx, `UPDATE idempotency_keys SET lock_token = $1 WHERE idempotency_key = $2`, [16]byte{1}, key)
				return err
			}
			_, err := ch.w.Run(context.Background(), ch.c, "acme", "k1", order{})
			if !errors.Is(err, keyrow.ErrLeaseLost) {
				t.Fatalf("run: %v; want the lease lost", err)
			}
			if got := ch.rows(t, "k1"); got != "" {
				t.Fatalf("committed rows of %s; want none: the first phase's commit carried the lost lease", got)
			}
			var rp string
			if err := ch.db.QueryRow(context.Background(), `SELECT recovery_point FROM idempotency_keys WHERE idempotency_key = 'k1'`).Scan(&rp); err != nil || rp != keyrow.Started {
				t.Fatalf("recovery point %q (%v); want %q", rp, err, keyrow.Started)
			}
			if ch.runs["third"].Load() != 1 { // the warm-up's
				t.Fatalf("the third phase ran %d times; want only in the warm-up", ch.runs["third"].Load())
			}
		})
	}
}

// TestAPhaseThatFailsBeforeItsFirstStatementLeavesThePhaseBeforeCommitted:
// the commit held back for a phase that fails before sending anything is
// sent on its own, so the key resumes after the phase before, as it would
// have without the hold.
func TestAPhaseThatFailsBeforeItsFirstStatementLeavesThePhaseBeforeCommitted(t *testing.T) {
	t.Parallel()
	for _, route := range pgtest.Routes() {
		t.Run(route.Name, func(t *testing.T) {
			t.Parallel()
			ch := newChainOn(t, route.PoolWith, nil)
			fail := true
			ch.before = func(ctx context.Context, key string) error {
				if fail {
					return errors.New("the second phase fails before its first statement")
				}
				return nil
			}
			ch.counter.Reset()
			if _, err := ch.w.Run(context.Background(), ch.c, "acme", "k1", order{}); err == nil || !strings.Contains(err.Error(), "fails before") {
				t.Fatalf("run: %v; want the second phase's error", err)
			}
			if got := ch.rows(t, "k1"); got != "first" {
				t.Fatalf("committed rows of %s; want first", got)
			}
			fail = false
			out, err := ch.w.Run(context.Background(), ch.c, "acme", "k1", order{})
			if err != nil || out.Kind != phase.OutcomeResumed {
				t.Fatalf("retry: %v, %v; want resumed", kindOf(out), err)
			}
			if got := ch.rows(t, "k1"); got != "first,second,third" {
				t.Fatalf("committed rows of %s; want all three", got)
			}
			if n := ch.runs["first"].Load(); n != 2 { // the warm-up's and the first run's
				t.Fatalf("the first phase ran %d times; want 2", n)
			}
		})
	}
}

// TestAHeldBackCommitThatFailsRunsItsPhaseAgainOrFailsTheRun makes the
// first phase's COMMIT fail, after the second phase's Go code has run, with
// a deferred constraint trigger: a serialization failure once, which runs
// the first phase again and then the rest, each row committed once; or a
// check violation, which ends the run as the first phase's failure with
// nothing committed and the key free to resume.
func TestAHeldBackCommitThatFailsRunsItsPhaseAgainOrFailsTheRun(t *testing.T) {
	t.Parallel()
	ch := newChain(t, &phase.Config{MaxPhaseRetries: 2})
	ctx := context.Background()
	if _, err := ch.db.Exec(ctx, `
CREATE TABLE commit_faults (k text PRIMARY KEY, sqlstate text NOT NULL);
CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE s text;
BEGIN
    SELECT sqlstate INTO s FROM commit_faults WHERE k = NEW.k;
    IF FOUND THEN
        RAISE EXCEPTION 'commit fault for %', NEW.k USING ERRCODE = s;
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER fail_commit AFTER INSERT ON chained DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION fail_commit();`); err != nil {
		t.Fatal(err)
	}
	// A fault stays armed until deleted.
	arm := func(key, sqlstate string) {
		if _, err := ch.db.Exec(ctx, `INSERT INTO commit_faults VALUES ('first/' || $1, $2)`, key, sqlstate); err != nil {
			t.Fatal(err)
		}
	}
	var seenSecond atomic.Int32
	ch.before = func(ctx context.Context, key string) error {
		if seenSecond.Add(1) == 2 && key == "retried" {
			// The second run of the second phase: the commit before it
			// failed once; let it pass now.
			_, err := ch.db.Exec(ctx, `DELETE FROM commit_faults WHERE k = 'first/retried'`)
			return err
		}
		return nil
	}

	arm("retried", "40001")
	out, err := ch.w.Run(ctx, ch.c, "acme", "retried", order{})
	if err != nil || out.Kind != phase.OutcomeNew {
		t.Fatalf("run: %v, %v", kindOf(out), err)
	}
	if got := ch.rows(t, "retried"); got != "first,second,third" {
		t.Fatalf("committed rows of %s; want all three once", got)
	}
	if got := ch.runs["first"].Load(); got != 1+2 {
		t.Fatalf("the first phase ran %d times; want 2 (and once in the warm-up)", got)
	}
	retried := 0
	for _, ev := range ch.events.Of("retried") {
		if ev.Kind == keyrow.EventRetried && ev.Phase == "first" {
			retried++
		}
	}
	if got := retried; got != 1 {
		t.Fatalf("%d retries of the first phase reported; want 1", got)
	}

	ch.before = nil
	arm("refused", "23514")
	_, err = ch.w.Run(ctx, ch.c, "acme", "refused", order{})
	if err == nil || !strings.Contains(err.Error(), "phase first: commit") || !strings.Contains(err.Error(), "commit fault for first/refused") {
		t.Fatalf("run: %v; want the first phase's commit failure", err)
	}
	if got := ch.rows(t, "refused"); got != "" {
		t.Fatalf("committed rows of %s; want none", got)
	}
	var rp string
	var locked bool
	if err := ch.db.QueryRow(ctx, `SELECT recovery_point, lock_token IS NOT NULL FROM idempotency_keys WHERE idempotency_key = 'refused'`).Scan(&rp, &locked); err != nil || rp != keyrow.Started || locked {
		t.Fatalf("recovery point %q, locked %v (%v); want %q and the lease freed", rp, locked, err, keyrow.Started)
	}
}

// transactionControl returns the statements of sqls that begin and end
// transactions, in order.
func transactionControl(sqls []string) string {
	var got []string
	for _, sql := range sqls {
		if strings.HasPrefix(sql, "begin") || strings.HasPrefix(sql, "COMMIT") {
			got = append(got, sql)
		}
	}
	return strings.Join(got, ",")
}

// TestAPhaseAtAnotherIsolationLevelBeginsATransactionOfItsOwn: a held-back
// commit chains the next phase's transaction to it only when the two run at
// the same isolation level; otherwise it is COMMIT, then BEGIN at the next
// phase's level. Each phase sees the level it asked for.
func TestAPhaseAtAnotherIsolationLevelBeginsATransactionOfItsOwn(t *testing.T) {
	t.Parallel()
	db, counter := pgtest.CountingPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	levels := map[string]string{}
	level := func(name string, res phase.Result) phase.LocalFunc[order, struct{}] {
		return func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			var l string
			err := tx.QueryRow(ctx, `SELECT current_setting('transaction_isolation')`).Scan(&l)
			levels[name] = l
			return res, err
		}
	}
	w, err := phase.NewWorkflow("levels",
		phase.Local("first", level("first", phase.Next())),
		phase.Local("second", level("second", phase.Next())).Isolation(pgx.Serializable),
		phase.Local("third", level("third", phase.Next())).Isolation(pgx.Serializable),
		phase.Local("fourth", level("fourth", phase.JSON(201, "ok"))))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
	if err != nil {
		t.Fatal(err)
	}
	// Prepares the statements on the connection first.
	if _, err := w.Run(context.Background(), c, "acme", "warm-up", order{}); err != nil {
		t.Fatal(err)
	}
	counter.Reset()
	if out, err := w.Run(context.Background(), c, "acme", "k1", order{}); err != nil || out.Kind != phase.OutcomeNew {
		t.Fatalf("run: %v, %v", kindOf(out), err)
	}
	want := "begin,COMMIT,begin isolation level serializable,COMMIT AND CHAIN,COMMIT,begin,COMMIT"
	if got := transactionControl(counter.SQL()); got != want {
		t.Errorf("transaction control statements\n%s; want\n%s", got, want)
	}
	for name, want := range map[string]string{"first": "read committed", "second": "serializable", "third": "serializable", "fourth": "read committed"} {
		if levels[name] != want {
			t.Errorf("phase %s ran at %q; want %q", name, levels[name], want)
		}
	}
}
