package recovery_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// exampleDB returns a pool on a fresh migrated database; the example
// stands in for your application's own pool here.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	dsn, drop, err := pgtest.NewDatabase(ctx, "example")
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() { pool.Close(); _ = drop() }
}

// A request stops after its first phase (its process died) and its client
// never comes back: the completer finishes it.
func Example_completer() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	type run = phase.Input[struct{ To string }, struct{}]
	w, err := phase.NewWorkflow("welcome",
		phase.Local("account_created", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.Next(), nil
		}),
		phase.Local("welcomed", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.JSON(201, "welcome, "+in.Req.To), nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, &phase.Config{
		// Take keys as soon as they are free, instead of a minute later.
		Completer: recovery.CompleterConfig{StuckAfter: -1},
	}, w)
	if err != nil {
		log.Fatal(err)
	}
	crash := phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "account_created", Stage: phase.AfterCommit}))
	_, err = w.Run(crash, client, "acme", "k1", struct{ To string }{"ada"})
	fmt.Println(err)
	// The dead process's lease would expire after the client's LeaseTTL;
	// an operator who knows the process is gone can free it at once.
	if _, err := client.Unlock(ctx, "acme", "k1"); err != nil {
		log.Fatal(err)
	}
	res, err := client.Complete(ctx) // what Start runs every Interval
	if err != nil {
		log.Fatal(err)
	}
	key, err := client.Inspect(ctx, "acme", "k1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Completed, key.RecoveryPoint, *key.ResponseStatus, string(key.ResponseBody))
	// Output:
	// phase: injected crash
	// 1 finished 201 "welcome, ada"
}
