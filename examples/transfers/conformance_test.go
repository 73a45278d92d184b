package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/conformance"
	"github.com/atomicphase/atomicphase/examples/internal/exampleprog/exampleprogtest"
	"github.com/atomicphase/atomicphase/examples/internal/fakeapi/fakeapitest"
	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// The transfers API, served by transfers serve in front of the fake payout
// provider, passes every scenario of the atomicphase profile strictly, for a payout,
// counted by the payouts the provider made, with a restart of the API in
// the middle of a storm. The provider answers slowly, so that a payout is
// in flight long enough to be caught. Two scenarios are skipped: scoping,
// since a transfer names an account of its caller's, which no other caller
// may move money from, and server-error, since the API answers no request
// with a 5xx.
func TestServePassesTheConformanceCheck(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	providerAddr, apiAddr := exampleprogtest.FreeAddr(t), exampleprogtest.FreeAddr(t)
	background(t, "payouts", "-addr", providerAddr, "-database-url", dsn)
	// The provider's tables must exist before serve migrates the ledger's.
	waitAnswered(t, providerAddr, "/_stats")
	serve := func() func() error {
		stop := background(t, "serve", "-addr", apiAddr, "-database-url", dsn, "-payouts-url", "http://"+providerAddr)
		waitAnswered(t, apiAddr, "/accounts")
		return stop
	}
	stopAPI := serve()

	var from int64
	_, _, accounts := send(t, http.MethodGet, apiAddr, "/accounts", "alice", "", "")
	var list []struct {
		ID       int64
		Currency string
	}
	if err := json.Unmarshal([]byte(accounts), &list); err != nil || len(list) == 0 {
		t.Fatalf("alice's accounts: %s (%v)", accounts, err)
	}
	for _, a := range list {
		if a.Currency == "EUR" {
			from = a.ID
			break
		}
	}
	if from == 0 {
		t.Fatalf("alice has no EUR account: %s", accounts)
	}
	res, err := http.Post("http://"+providerAddr+"/_faults", "application/json", strings.NewReader(`{"delay_ms": 150}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()

	payout := func(amount int) []byte {
		return fmt.Appendf(nil, `{"from_account":%d,"payout_destination":"dest_x","amount":%d,"currency":"EUR"}`, from, amount)
	}
	conformance.Test(t, conformance.Config{
		URL:       "http://" + apiAddr + "/transfers",
		Header:    http.Header{"Authorization": {"Bearer alice"}, "Content-Type": {"application/json"}},
		Body:      payout(1),
		OtherBody: payout(2),
		// The API is phase.Handler's: held to its spelling, not only to
		// what is safe.
		Profile: conformance.AtomicPhase(),
		Strict:  true,
		Executions: func(ctx context.Context) (int64, error) {
			return fakeapitest.Count(ctx, "http://"+providerAddr, payoutprovider.StatusPaid, payoutprovider.StatusFailed)
		},
		Restart: func(context.Context) error {
			if err := stopAPI(); err != nil {
				return err
			}
			stopAPI = serve()
			return nil
		},
	})
	if err := stopAPI(); err != nil {
		t.Error(err)
	}
}
