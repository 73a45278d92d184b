// Command quickstart is the README's complete program: an order endpoint
// that charges at most once per Idempotency-Key.
package main

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/phase"
)

type Order struct{ Item string }
type State struct{ OrderID int64 }

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // kill, Ctrl-C
	defer cancel()
	ln, err := net.Listen("tcp", "localhost:8080")
	check(err) // the port is taken: exit 1 before touching the database
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	check(err)
	check(atomicphase.Migrate(ctx, pool)) // the idempotency_keys table
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text, charge text)`)
	check(err)

	orders, err := phase.NewWorkflow("orders",
		phase.Local("order_created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, State]) (phase.Result, error) {
			err := tx.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, in.Req.Item).Scan(&in.State.OrderID)
			return phase.Next(), err // the row and the recovery point commit together
		}),
		phase.Foreign("charged",
			func(ctx context.Context, in *phase.Input[Order, State]) (string, error) {
				return charge(ctx, in.DownstreamKey()) // outside any transaction; the provider deduplicates on the key
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, State], chargeID string) (phase.Result, error) {
				_, err := tx.Exec(ctx, `UPDATE orders SET charge = $2 WHERE id = $1`, in.State.OrderID, chargeID)
				return phase.JSON(http.StatusCreated, map[string]any{"order": in.State.OrderID, "charge": chargeID}), err
			}).Repeatable(), // after a timeout, the retry repeats the call with the same key
	)
	check(err)
	client, err := phase.NewClient(pool, nil, orders) // runner, completer and reaper with their defaults
	check(err)
	handler, err := phase.Handler(client, orders, phase.HTTPConfig[Order]{
		Tenant: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }, // your auth
	})
	check(err)
	// The completer finishes requests whose client gave up; the reaper deletes expired keys. They run
	// until Stop, not until the signal, so that Stop gives their runs the time it gives the handler's.
	check(client.Start(context.Background()))
	srv := &http.Server{Handler: handler}
	go func() {
		if err := srv.Serve(ln); err != http.ErrServerClosed {
			log.Fatal(err)
		}
	}()
	log.Print("serving on http://localhost:8080")
	<-ctx.Done()
	cancel() // from here a second signal ends the program at once
	// First the requests in flight finish, then the completer's runs; a run cut short frees its
	// lease. Give them longer than a call (Config.CallTimeout, 1 min by default).
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancelShutdown()
	err = srv.Shutdown(shutdown)
	err = errors.Join(err, client.Stop(shutdown))
	grace, cancelGrace := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelGrace()
	check(errors.Join(err, srv.Shutdown(grace))) // the runs Stop cut short answer 503 first
	log.Print("stopped")
}

// charge stands in for a payment provider that honours idempotency keys.
func charge(ctx context.Context, idempotencyKey string) (string, error) {
	return "ch_" + idempotencyKey[12:20], nil
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
