package console_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/console"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

// The console is an http.Handler: mount it behind the application's own
// authentication. Its Authorizer names the person behind each request;
// here one bearer token lets in "alice", and nobody else gets in.
func ExampleNew() {
	ctx := context.Background()
	pool, done, err := pgtest.NewPool(ctx, "example") // your application's pool
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	w, err := phase.NewWorkflow("orders",
		phase.Local("ordered", func(ctx context.Context, tx pgx.Tx, in *phase.Input[struct{}, struct{}]) (phase.Result, error) {
			return phase.JSON(201, "ok"), nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.DiscardHandler)}, w)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := w.Run(ctx, client, "acme", "order-1", struct{}{}); err != nil {
		log.Fatal(err)
	}
	ui, err := console.New(console.Config{Client: client, Authorizer: console.Token("s3cret", "alice")})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", ui))

	for _, token := range []string{"", "s3cret"} {
		r := httptest.NewRequest(http.MethodGet, "/console/key?tenant=acme&key=order-1", nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, r)
		fmt.Println(rec.Code, "shows the key finished:", strings.Contains(rec.Body.String(), "finished"))
	}
	// Output:
	// 403 shows the key finished: false
	// 200 shows the key finished: true
}
