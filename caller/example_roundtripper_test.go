package caller_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

// A caller.Client is an http.RoundTripper: an http.Client built on it
// retries a keyed request the same way Do does. Here the key's first
// request is still running, so the server answers 409 with Retry-After;
// the retry after it gets the first request's answer, replayed.
func ExampleClient_RoundTrip() {
	ctx := context.Background()
	pool, done, err := pgtest.NewPool(ctx, "example") // your application's pool
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	started, release := make(chan struct{}), make(chan struct{})
	type run = phase.Input[struct{ Amount int }, struct{}]
	w, err := phase.NewWorkflow("orders", phase.Local("ordered", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
		close(started)
		<-release // the first request takes a while
		return phase.JSON(http.StatusCreated, map[string]string{"order": "o_1"}), nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.DiscardHandler), LeaseTTL: time.Second}, w)
	if err != nil {
		log.Fatal(err)
	}
	h, err := phase.Handler(client, w, phase.HTTPConfig[struct{ Amount int }]{
		Tenant: func(r *http.Request) (string, error) { return "acme", nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	api := httptest.NewServer(h)
	defer api.Close()
	post := func(c *http.Client) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, api.URL+"/orders", strings.NewReader(`{"Amount":500}`))
		req.Header.Set("Idempotency-Key", "k1")
		res, err := c.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		return res
	}
	first := make(chan *http.Response)
	go func() { first <- post(http.DefaultClient) }()
	<-started

	retrying, err := caller.New(caller.Config{Observe: func(a caller.Attempt) {
		fmt.Println("attempt", a.Number, a.Status)
		if a.Status == http.StatusConflict {
			close(release) // let the first request finish
		}
	}})
	if err != nil {
		log.Fatal(err)
	}
	res := post(&http.Client{Transport: retrying})
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	fmt.Print(res.StatusCode, " ", res.Header.Get("Idempotent-Replayed"), " ", string(body))
	(<-first).Body.Close()
	// Output:
	// attempt 1 409
	// attempt 2 201
	// 201 true {"order":"o_1"}
}
