package conformance_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/conformance"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

// Check sends an endpoint what retrying clients, dropped connections and
// crowds of concurrent clients send, and judges every answer. Here the
// endpoint is a phase.Handler, and Executions counts its effects, so each
// scenario also proves how many times the request ran.
func ExampleCheck() {
	ctx := context.Background()
	pool, done, err := pgtest.NewPool(ctx, "example") // your application's pool
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount int)`); err != nil {
		log.Fatal(err)
	}
	type Charge struct {
		Amount int `json:"amount"`
	}
	w, err := phase.NewWorkflow("charges",
		phase.Local("charged", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Charge, struct{}]) (phase.Result, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO charges (amount) VALUES ($1) RETURNING id`, in.Req.Amount).Scan(&id)
			return phase.JSON(http.StatusCreated, map[string]any{"id": id, "amount": in.Req.Amount}), err
		}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.DiscardHandler)}, w)
	if err != nil {
		log.Fatal(err)
	}
	h, err := phase.Handler(client, w, phase.HTTPConfig[Charge]{
		Tenant: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	report, err := conformance.Check(ctx, conformance.Config{
		Handler:     h,
		URL:         "/charges",
		Header:      http.Header{"Authorization": {"acme"}, "Content-Type": {"application/json"}},
		Body:        []byte(`{"amount": 2000}`),
		OtherCaller: http.Header{"Authorization": {"globex"}}, // keys are scoped to their caller
		Executions: func(ctx context.Context) (n int64, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n)
			return n, err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range report.Results {
		if r.Verdict == conformance.Fail {
			fmt.Println(r.Scenario, r.Why)
		}
	}
	fmt.Println("profile:", report.Profile, "failed:", report.Failed())
	// Output: profile: generic failed: false
}
