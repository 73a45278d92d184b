package phase_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// outsideText is error text as a provider or a phase may produce it: a NUL,
// which Postgres text cannot hold, and a byte that is not UTF-8.
const outsideText = "card\x00declined \xff!"

// outsideTextStored is outsideText as the key's last error keeps it.
const outsideTextStored = `card\0declined ` + "\uFFFD!"

// wantFailedAndFree fails t unless the key's failed run freed its lease and
// recorded its error, escaped.
func wantFailedAndFree(t *testing.T, c *phase.Client, key string) {
	t.Helper()
	row, err := c.Inspect(context.Background(), "acme", key)
	if err != nil {
		t.Fatal(err)
	}
	if row.LeaseExpiresAt != nil || row.ResponseStatus != nil {
		t.Fatalf("after the failed run: lease until %v, stored status %v; want the lease free and nothing stored", row.LeaseExpiresAt, row.ResponseStatus)
	}
	if !strings.Contains(row.LastError, outsideTextStored) {
		t.Fatalf("last error %q, want it to hold %q", row.LastError, outsideTextStored)
	}
}

// An error whose text Postgres cannot store does not keep the key's lease:
// the request answers its failure, the error is recorded escaped, and a
// retry runs at once instead of being refused as in flight.
func TestErrorTextWithNULAndInvalidUTF8FreesTheKey(t *testing.T) {
	t.Parallel()
	t.Run("foreign call", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.pay.fail = func(string) error { return fmt.Errorf("%w: %s", errBeforeCharge, outsideText) }
		h := e.handler(t)
		if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusInternalServerError {
			t.Fatalf("provider error: %d %s, want 500", rec.Code, rec.Body.String())
		}
		wantFailedAndFree(t, e.c, "k1")
		e.pay.fail = nil
		if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusCreated {
			t.Fatalf("retry: %d %s, want 201", rec.Code, rec.Body.String())
		}
		if _, id := e.orderCount(t, "k1"); e.pay.chargesFor(id) != 1 || e.pay.total() != 1 {
			t.Fatalf("%d charges for the order, %d in all; want 1", e.pay.chargesFor(id), e.pay.total())
		}
		row, err := e.c.Inspect(context.Background(), "acme", "k1")
		if err != nil || row.RecoveryPoint != keyrow.Finished || row.LastError != "" {
			t.Fatalf("after the retry: %+v %v; want finished with no error", row, err)
		}
	})
	t.Run("local phase", func(t *testing.T) {
		t.Parallel()
		var fail atomic.Bool
		fail.Store(true)
		runs := 0
		w, err := phase.NewWorkflow("noted", phase.Local("noted", func(ctx context.Context, tx pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			runs++
			if fail.Load() {
				return phase.Result{}, errors.New(outsideText)
			}
			return phase.JSON(http.StatusCreated, "noted"), nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		c, err := phase.NewClient(pgtest.Pool(t), &phase.Config{Logger: quiet}, w)
		if err != nil {
			t.Fatal(err)
		}
		h, err := phase.Handler(c, w, phase.HTTPConfig[order]{Tenant: func(*http.Request) (string, error) { return "acme", nil }})
		if err != nil {
			t.Fatal(err)
		}
		if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusInternalServerError {
			t.Fatalf("phase error: %d %s, want 500", rec.Code, rec.Body.String())
		}
		wantFailedAndFree(t, c, "k1")
		fail.Store(false)
		if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusCreated {
			t.Fatalf("retry: %d %s, want 201", rec.Code, rec.Body.String())
		}
		if runs != 2 {
			t.Fatalf("the phase ran %d times, want 2 (the failure and the retry)", runs)
		}
	})
}

// Whatever makes the server refuse a run's error (here a constraint an
// operator added), the lease is freed without it rather than kept until it
// expires.
func TestLeaseIsFreedWhenItsErrorCannotBeStored(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.db.Exec(context.Background(),
		`ALTER TABLE idempotency_keys ADD CONSTRAINT short_errors CHECK (length(last_error) < 100)`); err != nil {
		t.Fatal(err)
	}
	e.pay.fail = func(string) error { return fmt.Errorf("%w: %s", errBeforeCharge, strings.Repeat("detail ", 50)) }
	h := e.handler(t)
	if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusInternalServerError {
		t.Fatalf("provider error: %d %s, want 500", rec.Code, rec.Body.String())
	}
	row, err := e.c.Inspect(context.Background(), "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if row.LeaseExpiresAt != nil || row.LastError != "" || row.RecoveryPoint != "order_created" {
		t.Fatalf("after the failed run: lease until %v, last error %q, at %s; want the lease free, no error, after order_created",
			row.LeaseExpiresAt, row.LastError, row.RecoveryPoint)
	}
	e.pay.fail = nil
	if rec := post(h, "k1", `{"item":"lamp","amount":300}`); rec.Code != http.StatusCreated {
		t.Fatalf("retry: %d %s, want 201", rec.Code, rec.Body.String())
	}
	if orders, id := e.orderCount(t, "k1"); orders != 1 || e.pay.chargesFor(id) != 1 {
		t.Fatalf("%d orders, %d charges; want 1 and 1", orders, e.pay.chargesFor(id))
	}
}

// An operator's name and resolution are stored whatever text they hold: a
// NUL is kept as \0 and bytes that are not UTF-8 as U+FFFD, in the audit
// and in the output the record function reads.
func TestOperatorTextWithNULAndInvalidUTF8IsStoredEscaped(t *testing.T) {
	t.Parallel()
	n := &notifier{}
	c, _ := unknownKey(t, n, true)
	ctx := phase.WithActor(context.Background(), "ops\x00al\xffice")
	output := json.RawMessage("{\"id\":\"msg\\u0000from the dashboard \xff\"}")
	row, err := c.Resolve(ctx, "acme", "k1", keyrow.Resolution{RecoveryPoint: keyrow.Started, Happened: true, Output: output})
	if err != nil {
		t.Fatalf("resolve: %v, want it recorded", err)
	}
	var body message
	if row.RecoveryPoint != keyrow.Finished || json.Unmarshal(row.ResponseBody, &body) != nil ||
		body.ID != `msg\0from the dashboard `+"\uFFFD" {
		t.Fatalf("after resolve: %s, body %s; want finished with the operator's output, escaped", row.RecoveryPoint, row.ResponseBody)
	}
	d, err := c.Describe(ctx, "acme", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Audit) != 1 || d.Audit[0].Actor != `ops\0al`+"\uFFFD"+`ice` {
		t.Fatalf("audit = %+v, want one resolution by the escaped actor", d.Audit)
	}
	var detail keyrow.Resolution
	if err := json.Unmarshal(d.Audit[0].Detail, &detail); err != nil || !strings.Contains(string(detail.Output), `msg\\0from`) {
		t.Fatalf("audit detail %s (%v), want the output with its NUL escaped", d.Audit[0].Detail, err)
	}
	if calls := n.calls(); len(calls) != 1 {
		t.Fatalf("calls %q, want only the lost one", calls)
	}
}
