package payoutprovider_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi/fakeapitest"
	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// noKeepAlive opens a connection per request, so that Go's transport never
// resends a dropped request on its own and the tests see every fault.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

type env struct {
	db     *pgxpool.Pool
	srv    *payoutprovider.Server
	url    string
	client *payoutprovider.Client
}

func setup(t *testing.T) *env {
	t.Helper()
	srv, db, url := fakeapitest.Serve(t, payoutprovider.Migrate, func(db *pgxpool.Pool) *payoutprovider.Server {
		return payoutprovider.New(db, payoutprovider.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	})
	return &env{db: db, srv: srv, url: url, client: payoutprovider.NewClient(url, noKeepAlive)}
}

func (e *env) post(t *testing.T, key, body string) (int, http.Header, []byte) {
	t.Helper()
	header := http.Header{}
	if key != "" {
		header.Set("Idempotency-Key", key)
	}
	resp, b := fakeapitest.Do(t, http.MethodPost, e.url+"/v1/payouts", header, body)
	return resp.StatusCode, resp.Header, b
}

var params = payoutprovider.PayoutParams{Amount: 1250, Currency: "EUR", Destination: "dest_alice", Reference: "42"}

func TestSameKeyReplaysTheSamePayoutAndOtherParamsAreRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := `{"amount":1250,"currency":"EUR","destination":"dest_alice","reference":"42"}`
	status, hdr, first := e.post(t, "k1", body)
	if status != http.StatusOK || hdr.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %s", status, first)
	}
	// Same parameters in another order: the same payout, byte for byte.
	status, hdr, again := e.post(t, "k1", `{"reference":"42","destination":"dest_alice","currency":"EUR","amount":1250}`)
	if status != http.StatusOK || !bytes.Equal(again, first) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s (replayed %q), want %s", status, again, hdr.Get("Idempotent-Replayed"), first)
	}
	if status, _, b := e.post(t, "k1", strings.Replace(body, "1250", "1251", 1)); status != http.StatusBadRequest || !strings.Contains(string(b), "idempotency_error") {
		t.Fatalf("other params: %d %s, want 400 idempotency_error", status, b)
	}
	if status, _, _ := e.post(t, "", body); status != http.StatusBadRequest {
		t.Fatalf("no key: %d, want 400", status)
	}
	if s := e.srv.Stats(); s.Counts[payoutprovider.StatusPaid] != 1 || s.Replays != 1 {
		t.Fatalf("stats %+v, want one payout and one replay", s)
	}
}

func TestClientSeesFaultsAsUnknownOutcomesAndTheRetryPaysOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	if err := e.srv.SetFaults(payoutprovider.Faults{FailBefore: 1, TimeoutAfter: 1}); err != nil {
		t.Fatal(err)
	}
	for _, fault := range []string{"failure before the payout", "timeout after the payout"} {
		if _, err := e.client.CreatePayout(ctx, "k1", params); !errors.Is(err, payoutprovider.ErrOutcomeUnknown) {
			t.Fatalf("%s: %v, want ErrOutcomeUnknown", fault, err)
		}
	}
	p, err := e.client.CreatePayout(ctx, "k1", params)
	if err != nil || p.Status != payoutprovider.StatusPaid || p.Amount != 1250 || p.Reference != "42" {
		t.Fatalf("retry: %+v %v", p, err)
	}
	all, err := payoutprovider.Payouts(ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].ID != p.ID || all[0].IdempotencyKey != "k1" {
		t.Fatalf("payouts %+v, want only %s", all, p.ID)
	}
}

func TestClosedDestinationIsAStoredFailedPayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	closed := params
	closed.Destination = payoutprovider.ClosedDestination
	p, err := e.client.CreatePayout(ctx, "k1", closed)
	if err != nil || p.Status != payoutprovider.StatusFailed || p.FailureCode != payoutprovider.FailureAccountClosed {
		t.Fatalf("payout to a closed account: %+v %v, want failed account_closed", p, err)
	}
	again, err := e.client.CreatePayout(ctx, "k1", closed)
	if err != nil || again != p {
		t.Fatalf("retry: %+v %v, want %+v", again, err, p)
	}
}

func TestConcurrentRequestWithTheKeyGets409(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	// Each request holds the key for the delay. The second is sent once
	// the first has reached the provider, so that the two overlap however
	// slowly a busy machine schedules them: whichever takes the key first,
	// the other meets it held.
	if err := e.srv.SetFaults(payoutprovider.Faults{Delay: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { _, errs[0] = e.client.CreatePayout(ctx, "k1", params) })
	for e.srv.Stats().Requests == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	wg.Go(func() { _, errs[1] = e.client.CreatePayout(ctx, "k1", params) })
	wg.Wait()
	var apiErr *payoutprovider.Error
	conflicts := 0
	for _, err := range errs {
		if errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict {
			conflicts++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if conflicts != 1 || e.srv.Stats().Counts[payoutprovider.StatusPaid] != 1 {
		t.Fatalf("errors %v, stats %+v; want one payout and one 409", errs, e.srv.Stats())
	}
}

func TestFaultsAreControlledOverHTTP(t *testing.T) {
	t.Parallel()
	e := setup(t)
	resp, err := noKeepAlive.Post(e.url+"/_faults", "application/json", strings.NewReader(`{"timeout_after_payout":2,"delay_ms":5}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if f := e.srv.Faults(); resp.StatusCode != http.StatusOK || f.TimeoutAfter != 2 || f.Delay != 5*time.Millisecond {
		t.Fatalf("after POST /_faults: %d %+v", resp.StatusCode, f)
	}
	// Fields left out keep their value; a bad plan changes nothing.
	for _, body := range []string{`{"fail_before_payout_rate":0.5}`, `{"fail_before_payout_rate":2}`} {
		resp, err := noKeepAlive.Post(e.url+"/_faults", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if f := e.srv.Faults(); f.TimeoutAfter != 2 || f.FailBeforeRate != 0.5 {
		t.Fatalf("plan %+v, want the partial update kept and the bad one refused", f)
	}
}
