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

	"github.com/atomicphase/atomicphase/phase"
)

// A ride is answered 202 Accepted once its row is committed; finding a
// driver goes on in the background, and the caller polls the status.
func ExampleStatusHandler() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	type Ride struct{ From string }
	type run = phase.Input[Ride, struct{}]
	found := make(chan struct{}) // closed when a driver accepts
	w, err := phase.NewWorkflow("rides",
		phase.Local("ride_requested", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			return phase.Next(), nil
		}),
		phase.Foreign("driver_found",
			func(ctx context.Context, in *run) (string, error) { <-found; return "ada", nil },
			func(ctx context.Context, tx pgx.Tx, in *run, driver string) (phase.Result, error) {
				return phase.JSON(http.StatusCreated, map[string]string{"driver": driver}), nil
			}).Repeatable())
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, nil, w)
	if err != nil {
		log.Fatal(err)
	}
	tenant := func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }
	rides, err := phase.Handler(client, w, phase.HTTPConfig[Ride]{
		Tenant:         tenant,
		AcceptAfter:    "ride_requested",
		StatusLocation: func(r *http.Request, key string) string { return "/rides/status/" + key },
	})
	if err != nil {
		log.Fatal(err)
	}
	status, err := phase.StatusHandler(client, w, phase.StatusConfig{Tenant: tenant})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /rides", rides)
	mux.Handle("GET /rides/status/{key}", status)
	send := func(method, url, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, url, strings.NewReader(body))
		r.Header.Set("Authorization", "acme")
		r.Header.Set("Idempotency-Key", "r1")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, r)
		return rec
	}
	rec := send("POST", "/rides", `{"From":"station"}`)
	location := rec.Header().Get("Location")
	fmt.Println(rec.Code, location)
	rec = send("GET", location, "")
	fmt.Println(rec.Code, strings.TrimSpace(rec.Body.String()))

	close(found)
	for rec.Code == http.StatusAccepted {
		time.Sleep(10 * time.Millisecond)
		rec = send("GET", location, "")
	}
	fmt.Println(rec.Code, strings.TrimSpace(rec.Body.String()))
	if err := client.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// 202 /rides/status/r1
	// 202 {"status":"processing","recovery_point":"ride_requested"}
	// 201 {"driver":"ada"}
}
