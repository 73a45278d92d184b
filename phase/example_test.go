package phase_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// exampleDB returns a pool on a fresh migrated database; the examples stand
// in for your application's own pool here.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	dsn, drop, err := pgtest.NewDatabase(ctx, "example")
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE transfers (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount int, payout text)`); err != nil {
		log.Fatal(err)
	}
	return pool, func() { pool.Close(); _ = drop() }
}

type Transfer struct {
	Amount int    `json:"amount"`
	Payout string `json:"payout,omitempty"` // external destination, if any
}

type TransferState struct {
	TransferID int64  `json:"transfer_id"`
	PayoutID   string `json:"payout_id,omitempty"`
}

// sendPayout stands in for a payout provider that honours idempotency keys.
func sendPayout(ctx context.Context, destination string, amount int, idempotencyKey string) (string, error) {
	return "po_" + destination, nil
}

// A workflow of three phases; the foreign one applies only to transfers
// with an external payout.
func transfers() *phase.Workflow[Transfer, TransferState] {
	w, err := phase.NewWorkflow("transfers",
		phase.Local("transfer_created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Transfer, TransferState]) (phase.Result, error) {
			if in.Req.Amount <= 0 {
				return phase.JSON(http.StatusUnprocessableEntity, map[string]string{"error": "amount must be positive"}), nil
			}
			err := tx.QueryRow(ctx, `INSERT INTO transfers (amount) VALUES ($1) RETURNING id`, in.Req.Amount).Scan(&in.State.TransferID)
			return phase.Next(), err
		}),
		phase.Foreign("payout_sent",
			func(ctx context.Context, in *phase.Input[Transfer, TransferState]) (string, error) {
				return sendPayout(ctx, in.Req.Payout, in.Req.Amount, in.DownstreamKey())
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[Transfer, TransferState], payoutID string) (phase.Result, error) {
				in.State.PayoutID = payoutID
				_, err := tx.Exec(ctx, `UPDATE transfers SET payout = $2 WHERE id = $1`, in.State.TransferID, payoutID)
				return phase.Next(), err
			}).Repeatable().When(func(in *phase.Input[Transfer, TransferState]) bool { return in.Req.Payout != "" }),
		phase.Local("settled", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Transfer, TransferState]) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, in.State), nil
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	return w
}

func ExampleNewWorkflow() {
	w := transfers()
	fmt.Println(w.Name(), w.Phases())
	// Output: transfers [transfer_created payout_sent settled]
}

func ExampleWorkflow_Run() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	w := transfers()
	client, err := phase.NewClient(pool, nil, w)
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		out, err := w.Run(ctx, client, "acme", "key-1", Transfer{Amount: 500, Payout: "bank"})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(out.Kind, " ", out.Response.Status, " ", string(out.Response.Body))
	}
	// Output:
	// new 201 {"transfer_id":1,"payout_id":"po_bank"}
	// replayed 201 {"transfer_id":1,"payout_id":"po_bank"}
}

func ExampleHandler() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	w := transfers()
	client, err := phase.NewClient(pool, nil, w)
	if err != nil {
		log.Fatal(err)
	}
	h, err := phase.Handler(client, w, phase.HTTPConfig[Transfer]{
		// The tenant comes from authentication, never from the body.
		Tenant: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	send := func(key, body string) {
		r := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(body))
		r.Header.Set("Authorization", "acme")
		r.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		fmt.Println(rec.Code, rec.Header().Get("Idempotent-Replayed"), strings.TrimSpace(rec.Body.String()))
	}
	send("k1", `{"amount": 500}`)
	send("k1", `{"amount": 500}`) // a retry: the stored answer, byte for byte
	send("k1", `{"amount": 700}`) // the same key for another request
	// Output:
	// 201  {"transfer_id":1}
	// 201 true {"transfer_id":1}
	// 422  {"type":"urn:atomicphase:problem:idempotency-key-reused","title":"Idempotency-Key reused","status":422,"detail":"this Idempotency-Key was already used with a different request; use a new key for a new request"}
}

func ExampleCrashAt() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	w := transfers()
	client, err := phase.NewClient(pool, &phase.Config{Logger: quiet}, w)
	if err != nil {
		log.Fatal(err)
	}
	// Crash right after the payout was sent, before it was recorded.
	crash := phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "payout_sent", Stage: phase.AfterCall}))
	_, err = w.Run(crash, client, "acme", "key-1", Transfer{Amount: 500, Payout: "bank"})
	fmt.Println(err)

	// The crashed run still holds the lease; once it expires (Unlock does
	// it at once), the retry resumes after the last committed phase.
	if _, err := client.Unlock(ctx, "acme", "key-1"); err != nil {
		log.Fatal(err)
	}
	out, err := w.Run(ctx, client, "acme", "key-1", Transfer{Amount: 500, Payout: "bank"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(out.Kind, " ", string(out.Response.Body))
	// Output:
	// phase: injected crash
	// resumed {"transfer_id":1,"payout_id":"po_bank"}
}

func ExampleNewClient() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	w := transfers()
	// One client per process: it runs the workflows, and Start runs the
	// completer and the reaper. Every field has a documented default.
	client, err := phase.NewClient(pool, &phase.Config{
		LeaseTTL:    30 * time.Second,
		CallTimeout: 10 * time.Second,
		Completer:   recovery.CompleterConfig{Interval: time.Second},
		Reaper:      recovery.ReaperConfig{Retention: 48 * time.Hour},
	}, w)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	out, err := w.Run(ctx, client, "acme", "k1", Transfer{Amount: 100})
	if err != nil {
		log.Fatal(err)
	}
	counts, err := client.Counts(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(out.Kind, out.Response.Status, counts.Finished, counts.Unfinished())
	// Stop waits for runs in flight, up to ctx's deadline.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	// Output: new 201 1 0
}

func ExampleWorkflow_StoreResponses() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	w := transfers()
	// Transfers are kept 30 days, whatever the reapers of other services
	// sharing the table keep theirs; a retry also gets the X-Transfer-Id
	// header, beside those that describe the resource.
	if err := w.StoreResponses(phase.StoreConfig{
		Retention:     30 * 24 * time.Hour,
		ReplayHeaders: []string{"X-Transfer-Id"},
	}); err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, nil, w)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := w.Run(ctx, client, "acme", "k1", Transfer{Amount: 100}); err != nil {
		log.Fatal(err)
	}
	var kept time.Duration
	if err := pool.QueryRow(ctx, `SELECT retain_for FROM idempotency_keys`).Scan(&kept); err != nil {
		log.Fatal(err)
	}
	fmt.Println(kept)
	// Output: 720h0m0s
}
