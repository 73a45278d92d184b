package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/exampleprog/exampleprogtest"
	"github.com/atomicphase/atomicphase/examples/transfers/ledger"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

func TestServeThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bouncer := pgtest.BouncerDSN(t)
	// In pgx's default query exec mode, serve refuses to start.
	var refused bytes.Buffer
	if code := run(ctx, []string{"serve", "-addr", exampleprogtest.FreeAddr(t), "-database-url", bouncer}, io.Discard, &refused); code != 1 ||
		!strings.Contains(refused.String(), "default_query_exec_mode=cache_describe") {
		t.Fatalf("serve through the bouncer in pgx's default mode exited %d, want 1 saying which mode to set:\n%s", code, refused.String())
	}

	url := bouncer + " default_query_exec_mode=cache_describe"
	addr := exampleprogtest.FreeAddr(t)
	background(t, "serve", "-addr", addr, "-database-url", url)

	accountOf := func(owner, currency string) ledger.Account {
		t.Helper()
		status, _, body := send(t, http.MethodGet, addr, "/accounts", owner, "", "")
		var accounts []ledger.Account
		if status != http.StatusOK || json.Unmarshal([]byte(body), &accounts) != nil {
			t.Fatalf("GET /accounts as %s: %d %s", owner, status, body)
		}
		for _, a := range accounts {
			if a.Currency == currency {
				return a
			}
		}
		t.Fatalf("%s has no %s account: %s", owner, currency, body)
		return ledger.Account{}
	}
	from, to := accountOf("alice", "EUR"), accountOf("bob", "EUR")
	const transfers, amount = 5, 100
	for i := range transfers {
		key := fmt.Sprintf("transfer-%d", i)
		body := fmt.Sprintf(`{"from_account":%d,"to_account":%d,"amount":%d,"currency":"EUR"}`, from.ID, to.ID, amount)
		status, replayed, resp := send(t, http.MethodPost, addr, "/transfers", "alice", key, body)
		if status != http.StatusCreated || replayed {
			t.Fatalf("POST %s: %d replayed=%v %s", key, status, replayed, resp)
		}
		if status, replayed, again := send(t, http.MethodPost, addr, "/transfers", "alice", key, body); status != http.StatusCreated || !replayed || again != resp {
			t.Fatalf("retry of %s: %d replayed=%v %s, want a replay of %s", key, status, replayed, again, resp)
		}
	}
	if got := accountOf("alice", "EUR").Balance; got != from.Balance-transfers*amount {
		t.Errorf("alice's balance %d after %d transfers of %d from %d", got, transfers, amount, from.Balance)
	}

	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	report, err := ledger.Verify(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if !report.OK() {
		var out bytes.Buffer
		_ = report.Write(&out)
		t.Fatalf("ledger invariants broken:\n%s", out.String())
	}
}

// send sends a request as owner, with the key when not empty, retrying
// until the API answers, and returns the status, whether it was a replay
// and the body.
func send(t *testing.T, method, addr, path, owner, key, body string) (status int, replayed bool, resp string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+owner)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			b, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			return res.StatusCode, res.Header.Get(phase.ReplayedHeader) == "true", string(b)
		}
		// The server is still migrating and not yet listening.
		if time.Now().After(deadline) {
			t.Fatalf("the API did not answer within 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// background runs transfers with args until the test ends or the returned
// func stops it, which returns the error of a run that did not exit 0.
func background(t *testing.T, args ...string) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stderr bytes.Buffer
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, args, &bytes.Buffer{}, &stderr) }()
	stop = sync.OnceValue(func() error {
		cancel()
		if code := <-exited; code != 0 {
			return fmt.Errorf("transfers %s exited %d:\n%s", args[0], code, stderr.String())
		}
		return nil
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return stop
}

// waitAnswered waits until GET path on addr is answered, whatever the
// answer (see send).
func waitAnswered(t *testing.T, addr, path string) {
	t.Helper()
	send(t, http.MethodGet, addr, path, "alice", "", "")
}
