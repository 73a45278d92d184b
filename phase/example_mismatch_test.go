package phase_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/atomicphase/atomicphase/phase"
)

// A key reused for another request is a mismatch: nothing runs. Run
// reports it as an outcome; the handler answers 422, or the status of
// HTTPConfig.MismatchStatus (400 for a Stripe-style API).
func ExampleOutcomeKind_mismatch() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	w := transfers()
	client, err := phase.NewClient(pool, nil, w)
	if err != nil {
		log.Fatal(err)
	}
	for _, amount := range []int{500, 700} {
		out, err := w.Run(ctx, client, "acme", "k1", Transfer{Amount: amount})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out.Kind, out.Kind == phase.OutcomeMismatch)
	}

	h, err := phase.Handler(client, w, phase.HTTPConfig[Transfer]{
		Tenant:         func(r *http.Request) (string, error) { return "acme", nil },
		MismatchStatus: http.StatusBadRequest,
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, body := range []string{`{"amount":500}`, `{"amount":700}`} {
		r := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "k2")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	}
	// Output:
	// new false
	// mismatch true
	// 201 application/json
	// 400 application/problem+json
}
