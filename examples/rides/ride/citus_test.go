package ride_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/examples/rides/ride"
)

// TestCitusRidesChargeOnceWithTablesColocatedWithTheKeys runs the rides
// service on a Citus cluster after ride.Distribute: users is a reference
// table, and the tables the phases write are distributed by tenant,
// co-located with idempotency_keys. A ride is charged once and replayed, a
// declined card is stored, the receipt is sent, and Distribute run again
// changes nothing.
func TestCitusRidesChargeOnceWithTablesColocatedWithTheKeys(t *testing.T) {
	t.Parallel()
	e := setupWith(t, 10, &configurer{citus: true})
	ctx := context.Background()

	rows, err := e.pool.Query(ctx, `
		SELECT p.logicalrelid::text, p.partmethod::text,
		       p.colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass)
		FROM pg_dist_partition p
		WHERE p.logicalrelid IN ('users'::regclass, 'rides'::regclass, 'audit_records'::regclass, 'receipts'::regclass)`)
	if err != nil {
		t.Fatal(err)
	}
	placed := map[string]string{}
	for rows.Next() {
		var table, method string
		var colocated bool
		if err := rows.Scan(&table, &method, &colocated); err != nil {
			t.Fatal(err)
		}
		switch {
		case method == "n":
			placed[table] = "reference"
		case method == "h" && colocated:
			placed[table] = "with the keys"
		default:
			placed[table] = "elsewhere (" + method + ")"
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"users": "reference", "rides": "with the keys", "audit_records": "with the keys", "receipts": "with the keys"}
	for table, w := range want {
		if placed[table] != w {
			t.Errorf("table %s is distributed %q, want %q", table, placed[table], w)
		}
	}

	first := e.post("citus-ride", ride.UserEmail, ridePayload)
	if first.Code != http.StatusCreated {
		t.Fatalf("ride: %d %s", first.Code, first.Body)
	}
	again := e.post("citus-ride", ride.UserEmail, ridePayload)
	if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %s (replayed %q), want the first answer replayed: %s",
			again.Code, again.Body, again.Header().Get("Idempotent-Replayed"), first.Body)
	}
	if _, charges := e.chargesForKey(t, "citus-ride"); charges != 1 {
		t.Errorf("%d charges for the ride, want 1", charges)
	}
	if rec := e.post("citus-declined", ride.DeclinedEmail, ridePayload); rec.Code != http.StatusPaymentRequired {
		t.Errorf("declined rider: %d %s, want 402", rec.Code, rec.Body)
	}

	if err := e.app.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.app.Stop(stopCtx); err != nil {
			t.Error(err)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := e.verify(t)
		if r.Receipts == 1 && r.FinishedKeys == 2 && r.Charges == 1 && r.Created == 1 && r.Declined == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the rides: %+v; want 2 keys finished, 1 charge, 1 created, 1 declined, 1 receipt", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := ride.Distribute(ctx, e.pool); err != nil {
		t.Fatalf("Distribute again: %v", err)
	}
	if rec := e.post("citus-ride", ride.UserEmail, ridePayload); rec.Body.String() != first.Body.String() {
		t.Errorf("after Distribute again: %d %s, want the first answer replayed", rec.Code, rec.Body)
	}
}
