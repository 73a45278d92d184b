package ride_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/internal/testenv"
	"github.com/atomicphase/atomicphase/phase"
)

// stripeMockVersion is the stripe-mock release the charge requests are
// checked against; it validates every request against Stripe's OpenAPI spec.
const stripeMockVersion = "v0.203.0"

// stripeMock starts stripe-mock, building it first into stripeMockDir when
// it is not there, or skips the test saying why it cannot (the build needs
// the Go module proxy).
func stripeMock(t *testing.T) string {
	t.Helper()
	dir := stripeMockDir(t)
	bin := filepath.Join(dir, "stripe-mock")
	if _, err := os.Stat(bin); err != nil {
		cmd := exec.Command("go", "install", "github.com/stripe/stripe-mock@"+stripeMockVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			testenv.SkipWithout(t, "stripe-mock", fmt.Errorf("cannot build stripe-mock %s with go install (needs the Go module proxy): %v\n%s", stripeMockVersion, err, out))
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "-http-addr", addr)
	if err := cmd.Start(); err != nil {
		testenv.SkipWithout(t, "stripe-mock", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("stripe-mock did not listen on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stripeMockDir is where the stripe-mock binary (about 33 MB) is kept
// between test runs: atomicphase/stripe-mock-<version> in the user's cache
// directory (os.UserCacheDir: $XDG_CACHE_HOME or ~/.cache on Linux,
// ~/Library/Caches on macOS), so that it is built once per machine and
// version and is found where caches are cleaned. Without a cache directory
// it is built into the test's temporary directory, removed afterwards.
func stripeMockDir(t *testing.T) string {
	cache, err := os.UserCacheDir()
	if err != nil {
		return t.TempDir()
	}
	return filepath.Join(cache, "atomicphase", "stripe-mock-"+stripeMockVersion)
}

func TestChargePhaseSendsValidStripeRequests(t *testing.T) {
	t.Parallel()
	mockURL := stripeMock(t)
	e := setup(t, 5)
	sc := ride.NewStripeClient(mockURL, "sk_test_123", &http.Client{Timeout: 10 * time.Second})

	// stripe-mock refuses what Stripe would refuse: a parameter the API
	// does not define is a 400, so a success below means a valid request.
	bad := url.Values{"amount": {strconv.Itoa(ride.Amount)}, "currency": {"usd"}, "ride_id": {"1"}}
	req, err := http.NewRequest(http.MethodPost, mockURL+"/v1/charges", strings.NewReader(bad.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer sk_test_123")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("charge with an undefined parameter: %s, want stripe-mock's 400", res.Status)
	}

	app, err := ride.New(ride.Config{Pool: e.pool, Stripe: sc, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	out, err := app.Workflow.Run(context.Background(), app.Client, ride.UserEmail, "mock-1",
		ride.Request{OriginLat: 1, OriginLon: 2, TargetLat: 3, TargetLon: 4})
	if err != nil {
		t.Fatalf("ride through stripe-mock: %v", err)
	}
	if out.Kind != phase.OutcomeNew || out.Response.Status != http.StatusCreated {
		t.Fatalf("ride through stripe-mock: %v %d %s", out.Kind, out.Response.Status, out.Response.Body)
	}
	var charge string
	if err := e.pool.QueryRow(context.Background(), `SELECT stripe_charge_id FROM rides`).Scan(&charge); err != nil || charge == "" {
		t.Fatalf("recorded charge %q (%v)", charge, err)
	}
}
