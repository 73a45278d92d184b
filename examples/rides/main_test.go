package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestServeThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bouncer := pgtest.BouncerDSN(t)
	// In pgx's default query exec mode, serve refuses to start.
	err := serve(ctx, []string{"-addr", freeAddr(t), "-database-url", bouncer, "-poll-only"}, io.Discard, io.Discard)
	if !errors.Is(err, phase.ErrTransactionPooler) {
		t.Fatalf("serve through the bouncer in pgx's default mode: %v, want ErrTransactionPooler", err)
	}

	url := bouncer + " default_query_exec_mode=cache_describe"
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stripeAPI := httptest.NewServer(fakestripe.New(db, fakestripe.Config{}))
	defer stripeAPI.Close()

	addr := freeAddr(t)
	serveCtx, stop := context.WithCancel(ctx)
	var stderr bytes.Buffer
	served := make(chan error, 1)
	go func() {
		served <- serve(serveCtx, []string{"-addr", addr, "-database-url", url, "-stripe-url", stripeAPI.URL,
			"-poll-only", "-completer-interval", "100ms"}, io.Discard, &stderr)
	}()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v\n%s", err, stderr.String())
		}
	}()

	const rides = 5
	first := map[string]string{}
	for i := range rides {
		key := fmt.Sprintf("ride-%d", i)
		status, replayed, body := postRide(t, addr, key)
		if status != http.StatusCreated || replayed {
			t.Fatalf("POST %s: %d replayed=%v %s", key, status, replayed, body)
		}
		first[key] = body
	}
	for key, body := range first {
		if status, replayed, again := postRide(t, addr, key); status != http.StatusCreated || !replayed || again != body {
			t.Fatalf("retry of %s: %d replayed=%v %s, want a replay of %s", key, status, replayed, again, body)
		}
	}
	// River, polling through the bouncer, sends each ride's receipt once.
	sc := ride.NewStripeClient(stripeAPI.URL, "sk_test_rides", nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		report, err := ride.Verify(ctx, db, sc)
		if err != nil {
			t.Fatal(err)
		}
		if len(report.Failures()) > 0 {
			t.Fatalf("invariants broken: %v", report.Failures())
		}
		if report.Receipts == rides {
			if report.Charges != rides || report.Rides != rides {
				t.Fatalf("%d rides and %d charges for %d keys", report.Rides, report.Charges, rides)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d receipts sent after 30s\n%s", report.Receipts, rides, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// postRide posts a ride with the key, retrying until the API answers, and
// returns the status, whether it was a replay and the body.
func postRide(t *testing.T, addr, key string) (status int, replayed bool, body string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/rides", strings.NewReader("origin_lat=1&origin_lon=2&target_lat=3&target_lon=4"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", ride.UserEmail)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			return resp.StatusCode, resp.Header.Get(phase.ReplayedHeader) == "true", string(b)
		}
		// The server is still migrating and not yet listening.
		if time.Now().After(deadline) {
			t.Fatalf("the API did not answer within 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freeAddr returns a local address no one listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
