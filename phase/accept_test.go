package phase_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/phase"
)

// acceptEnv is the orders workflow answering 202 once the order row is
// committed, with its status handler.
func acceptEnv(t *testing.T, mutate ...func(*phase.Config)) (*env, http.Handler, http.Handler) {
	t.Helper()
	e := setup(t, mutate...)
	h := e.handler(t, func(cfg *phase.HTTPConfig[order]) {
		cfg.AcceptAfter = "order_created"
		cfg.StatusLocation = func(r *http.Request, key string) string { return "/orders/status/" + key }
	})
	status, err := phase.StatusHandler(e.c, e.w, phase.StatusConfig{
		Tenant: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /orders/status/{key}", status)
	return e, h, mux
}

func getStatus(h http.Handler, tenant, location string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, location, nil)
	r.Header.Set("Authorization", tenant)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// waitFinished polls the status location until it stops answering 202.
func waitFinished(t *testing.T, h http.Handler, location string) *httptest.ResponseRecorder {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec := getStatus(h, "acme", location)
		if rec.Code != http.StatusAccepted || time.Now().After(deadline) {
			return rec
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAcceptedRequestAnswers202AndFinishesInTheBackground(t *testing.T) {
	t.Parallel()
	e, h, status := acceptEnv(t)
	e.pay.delay = 300 * time.Millisecond // the charge outlasts the answer
	body := `{"item":"book","amount":500}`

	first := post(h, "k1", body)
	location := first.Header().Get("Location")
	if first.Code != http.StatusAccepted || location != "/orders/status/k1" || first.Header().Get("Retry-After") == "" {
		t.Fatalf("first answer %d, Location %q, Retry-After %q; want 202 with the status location",
			first.Code, location, first.Header().Get("Retry-After"))
	}
	var st struct{ Status, RecoveryPoint string }
	if err := json.Unmarshal(first.Body.Bytes(), &st); err != nil || st.Status != "processing" {
		t.Fatalf("202 body %s: want status processing", first.Body)
	}
	if orders, _ := e.orderCount(t, "k1"); orders != 1 {
		t.Fatalf("%d orders when the 202 was answered; the accepting phase must have committed", orders)
	}
	// While the charge runs, a retry is accepted again, not refused.
	if again := post(h, "k1", body); again.Code != http.StatusAccepted || again.Header().Get("Location") != location {
		t.Fatalf("retry while running: %d %s, want 202 with the same location", again.Code, again.Body)
	}
	if rec := getStatus(status, "acme", location); rec.Code != http.StatusAccepted {
		t.Fatalf("status while running: %d %s, want 202", rec.Code, rec.Body)
	}

	final := waitFinished(t, status, location)
	if final.Code != http.StatusCreated || final.Header().Get(phase.ReplayedHeader) != "true" ||
		!strings.Contains(final.Body.String(), "order placed") {
		t.Fatalf("final status: %d %v %s, want the stored 201", final.Code, final.Header(), final.Body)
	}
	replay := post(h, "k1", body)
	if replay.Code != http.StatusCreated || replay.Body.String() != final.Body.String() {
		t.Fatalf("retry after the end: %d %s, want the stored 201 %s", replay.Code, replay.Body, final.Body)
	}
	if _, id := e.orderCount(t, "k1"); e.pay.chargesFor(id) != 1 {
		t.Fatalf("%d charges, want 1", e.pay.chargesFor(id))
	}
}

// A run that crashes in the background after its 202 is resumed by the
// next retry, which is accepted at once, and finishes with one charge.
func TestAcceptedRunThatCrashesIsResumed(t *testing.T) {
	t.Parallel()
	e, h, status := acceptEnv(t, func(cfg *phase.Config) {
		cfg.LeaseTTL = time.Second
		cfg.Hooks = append(cfg.Hooks, phase.CrashAt(phase.Point{Phase: "charged", Stage: phase.AfterCall}))
	})
	body := `{"item":"book","amount":500}`
	if rec := post(h, "k1", body); rec.Code != http.StatusAccepted {
		t.Fatalf("first answer %d %s, want 202", rec.Code, rec.Body)
	}
	// The crashed run keeps its lease: the key stays accepted.
	time.Sleep(100 * time.Millisecond)
	if rec := getStatus(status, "acme", "/orders/status/k1"); rec.Code != http.StatusAccepted {
		t.Fatalf("status after the crash: %d %s, want 202", rec.Code, rec.Body)
	}
	if rec := post(h, "k1", body); rec.Code != http.StatusAccepted {
		t.Fatalf("retry during the crashed lease: %d %s, want 202", rec.Code, rec.Body)
	}
	time.Sleep(1100 * time.Millisecond) // the crashed run's lease expires
	if rec := post(h, "k1", body); rec.Code != http.StatusAccepted {
		t.Fatalf("retry that resumes: %d %s, want 202", rec.Code, rec.Body)
	}
	if final := waitFinished(t, status, "/orders/status/k1"); final.Code != http.StatusCreated {
		t.Fatalf("final status %d %s, want 201", final.Code, final.Body)
	}
	if _, id := e.orderCount(t, "k1"); e.pay.chargesFor(id) != 1 {
		t.Fatalf("%d charges, want 1", e.pay.chargesFor(id))
	}
}

// A request refused by the accepting phase itself is answered at once.
func TestRequestAnsweredBeforeTheAcceptingPhaseIsNotAccepted(t *testing.T) {
	t.Parallel()
	_, h, _ := acceptEnv(t)
	if rec := post(h, "k1", `{"item":"book","amount":0}`); rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("answer %d %s, want the stored 422", rec.Code, rec.Body)
	}
}

func TestStatusShowsATenantOnlyItsOwnKeys(t *testing.T) {
	t.Parallel()
	_, h, status := acceptEnv(t)
	if rec := post(h, "k1", `{"item":"book","amount":500}`); rec.Code != http.StatusAccepted {
		t.Fatalf("answer %d, want 202", rec.Code)
	}
	waitFinished(t, status, "/orders/status/k1")
	for _, tc := range []struct{ tenant, key string }{{"globex", "k1"}, {"acme", "k2"}} {
		if rec := getStatus(status, tc.tenant, "/orders/status/"+tc.key); rec.Code != http.StatusNotFound {
			t.Errorf("%s asking for %s: %d %s, want 404", tc.tenant, tc.key, rec.Code, rec.Body)
		}
	}
}

func TestAcceptConfigIsValidated(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, cfg := range []phase.HTTPConfig[order]{
		{AcceptAfter: "no_such_phase", StatusLocation: func(*http.Request, string) string { return "" }},
		{AcceptAfter: "receipt_sent", StatusLocation: func(*http.Request, string) string { return "" }},
		{AcceptAfter: "order_created"},
	} {
		cfg.Tenant = func(*http.Request) (string, error) { return "acme", nil }
		if _, err := phase.Handler(e.c, e.w, cfg); err == nil {
			t.Errorf("Handler accepted AcceptAfter %q (StatusLocation set: %v)", cfg.AcceptAfter, cfg.StatusLocation != nil)
		}
	}
}
