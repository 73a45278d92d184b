package phase_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/phase"
)

// Respond ends a workflow with any response. It is stored in the last
// phase's commit, and every retry gets it again: status, body, and the
// headers that describe the resource (see DefaultReplayHeaders).
func ExampleRespond() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	type run = phase.Input[struct{ Text string }, struct{}]
	w, err := phase.NewWorkflow("notes",
		phase.Local("note_created", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			header := http.Header{"Location": {"/notes/1"}, "Content-Type": {"text/plain"}}
			return phase.Respond(http.StatusCreated, header, []byte("created: "+in.Req.Text)), nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, nil, w)
	if err != nil {
		log.Fatal(err)
	}
	h, err := phase.Handler(client, w, phase.HTTPConfig[struct{ Text string }]{
		Tenant: func(r *http.Request) (string, error) { return "acme", nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/notes", strings.NewReader(`{"Text":"hello"}`))
		r.Header.Set("Idempotency-Key", "k1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		fmt.Printf("%d %s replayed=%q %s\n", rec.Code, rec.Header().Get("Location"),
			rec.Header().Get(phase.ReplayedHeader), rec.Body)
	}
	// Output:
	// 201 /notes/1 replayed="" created: hello
	// 201 /notes/1 replayed="true" created: hello
}
