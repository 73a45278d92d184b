package recovery_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// The reaper deletes finished keys once their retention has passed. An
// unfinished key left that long is abandoned: the reaper gives it a
// terminal response first, then deletes it too.
func Example_reaper() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	type run = phase.Input[struct{}, struct{}]
	w, err := phase.NewWorkflow("exports",
		phase.Local("export_started", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.Next(), nil
		}),
		phase.Local("exported", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.JSON(201, "exported"), nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, &phase.Config{
		Logger: slog.New(slog.DiscardHandler),
		Reaper: recovery.ReaperConfig{Retention: time.Millisecond}, // a day by default
	}, w)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := w.Run(ctx, client, "acme", "finished", struct{}{}); err != nil {
		log.Fatal(err)
	}
	crash := phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "export_started", Stage: phase.AfterCommit}))
	if _, err := w.Run(crash, client, "acme", "abandoned", struct{}{}); err == nil {
		log.Fatal("no crash")
	}
	if _, err := client.Unlock(ctx, "acme", "abandoned"); err != nil { // its process is gone
		log.Fatal(err)
	}
	// Start runs the reaper every Interval; here it runs twice, a moment
	// apart, past the retention of every key.
	var reaped, abandoned int
	for range 2 {
		time.Sleep(10 * time.Millisecond)
		res, err := client.Reap(ctx)
		if err != nil {
			log.Fatal(err)
		}
		reaped, abandoned = reaped+res.Reaped, abandoned+res.Abandoned
	}
	fmt.Println("reaped:", reaped, "abandoned:", abandoned)
	counts, err := client.Counts(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("keys left:", counts.Total())
	// Output:
	// reaped: 2 abandoned: 1
	// keys left: 0
}
