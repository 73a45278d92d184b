package atomicphase_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// oldKey is a key in flight as an earlier release left it.
type oldKey struct {
	key    string
	amount int
	// point is the recovery point of its last committed phase, state the
	// phase state committed with it.
	point, state string
	// leased keys were held by a process that died: their lease has
	// expired. hold is NULL when empty; pending is the call that may be
	// under way, recorded from version 5 on.
	leased        bool
	hold, pending string
	// fingerprint is the stored fingerprint, in hex, of each generation.
	fingerprint [2]string
}

// upgradeKeys are the keys in flight: one finished, one whose charge
// committed, one whose ride committed and whose charge is yet to be sent,
// and one on hold because its charge may have been sent. The fingerprints
// are written out, as the release that stored them computed them, for
// {"amount":N,"currency":"usd"}: of generation 1 under workflow "rides", of
// generation 2 sent to /rides as application/json.
var upgradeKeys = []oldKey{
	{key: "finished", amount: 500, point: keyrow.Finished, state: `{"ride_id": 1, "charge_id": "ch_1"}`, fingerprint: [2]string{
		"0600f3726e24f8c41f7595adb2d7bd09ae03e96a0fd052da66ff1c3a79a75b14",
		"d178217dd6097aad1ba1aa8c8616383574f9065794014438f0c4677d279e812c"}},
	{key: "charged", amount: 200, point: "charge", state: `{"ride_id": 2, "charge_id": "ch_2"}`, leased: true, fingerprint: [2]string{
		"6661cef2610357407bd75d0786cd0174f414008a5712e9f0158291dd7f8b56ac",
		"0fddb641b0518a7cc658cf9026c0d5cc7a6548fc7fde8076dd02b0bdd7d27aae"}},
	{key: "ride-created", amount: 300, point: "create_ride", state: `{"ride_id": 3}`, leased: true, fingerprint: [2]string{
		"f41bb3dc99b234a09aaa3f4f8ca62293188b073578c1409857c3a4f87b788142",
		"ffae4de9e0326aea6941660f1717df9bb03221828393cc03d5e59aeda90eba09"}},
	{key: "held", amount: 400, point: "create_ride", state: `{"ride_id": 4}`, hold: "unknown", pending: "charge", fingerprint: [2]string{
		"d3a23726e2232fdb56a9c63f1ed92e30a6c361fbd2a48a4aa5d7ba2f406198ed",
		"2bc56055c443168c7dfdd4776441916fc57a02ded886073138a1bcf794935c00"}},
}

// The finished key's stored response.
const (
	finishedBody     = `{"ride_id":1,"charge_id":"ch_1"}` + "\n"
	finishedLocation = "/rides/1"
)

// ridesDefinition is the definition of upgradeWorkflow, as keys written
// since version 5 record it (testdata/golden-definitions.json, "rides").
const ridesDefinition = "7df0c6e7d437512b"

// The downstream key the charge of "ride-created" must go out with, from
// its stored fingerprint of each generation (keyrow.DownstreamKey).
var rideCreatedDownstreamKey = [2]string{
	"atomicphase-ae20df4d4ae75d035063719c6ea89196-charge",
	"atomicphase-d26a5c138b7c701dddf2ad7a80f64be9-charge",
}

// insertOldKey writes k as the release at schema version did: before
// version 5 with the columns of migration 001 and the first generation of
// fingerprint, from version 5 on with the definition, the pending call and
// the second generation.
func insertOldKey(t *testing.T, conn *pgx.Conn, version int, k oldKey) {
	t.Helper()
	columns := `tenant, idempotency_key, workflow, request_params, recovery_point, phase_state, attempts,
		request_fingerprint, hold, locked_at, lock_expires_at, lock_token,
		finished_at, response_status, response_headers, response_body`
	values := `'acme', $1, 'rides', $2, $3, $4, 1,
		decode($5, 'hex'), $6, CASE WHEN $7 THEN now() - interval '10 minutes' END,
		CASE WHEN $7 THEN now() - interval '9 minutes' END, CASE WHEN $7 THEN gen_random_uuid() END,
		CASE WHEN $8 THEN now() - interval '1 hour' END, CASE WHEN $8 THEN 201 END,
		CASE WHEN $8 THEN jsonb_build_object('Content-Type', jsonb_build_array('application/json'), 'Location', jsonb_build_array($9::text)) END,
		CASE WHEN $8 THEN convert_to($10, 'UTF8') END`
	generation := 0
	args := []any{k.key, fmt.Sprintf(`{"amount": %d, "currency": "usd"}`, k.amount), k.point, k.state, "",
		nilIfEmpty(k.hold), k.leased, k.point == keyrow.Finished, finishedLocation, finishedBody}
	if version >= 5 {
		generation = 1
		columns += ", definition, call_pending"
		values += ", $11, $12"
		args = append(args, ridesDefinition, nilIfEmpty(k.pending))
	}
	args[4] = k.fingerprint[generation]
	if _, err := conn.Exec(context.Background(), "INSERT INTO idempotency_keys ("+columns+") VALUES ("+values+")", args...); err != nil {
		t.Fatalf("insert key %s as version %d wrote it: %v", k.key, version, err)
	}
}

func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

type rideReq struct {
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

type rideState struct {
	RideID   int    `json:"ride_id"`
	ChargeID string `json:"charge_id,omitempty"`
}

// upgradeRuns counts, by "phase key", the phases that committed work and
// the charges sent, by downstream key.
type upgradeRuns struct {
	mu      sync.Mutex
	phases  map[string]int
	charges map[string]int
}

func (r *upgradeRuns) add(m map[string]int, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m[name]++
}

// upgradeWorkflow is the rides workflow of today, with the phases the old
// release ran: create the ride, charge, send the receipt.
func upgradeWorkflow(t *testing.T, runs *upgradeRuns) *phase.Workflow[rideReq, rideState] {
	t.Helper()
	type in = phase.Input[rideReq, rideState]
	w, err := phase.NewWorkflow("rides",
		phase.Local("create_ride", func(_ context.Context, _ pgx.Tx, in *in) (phase.Result, error) {
			runs.add(runs.phases, "create_ride "+in.Key)
			in.State.RideID = in.Req.Amount
			return phase.Next(), nil
		}),
		phase.Foreign("charge",
			func(_ context.Context, in *in) (string, error) {
				runs.add(runs.charges, in.DownstreamKey())
				return "ch_" + in.Key, nil
			},
			func(_ context.Context, _ pgx.Tx, in *in, charge string) (phase.Result, error) {
				runs.add(runs.phases, "charge "+in.Key)
				in.State.ChargeID = charge
				return phase.Next(), nil
			}),
		phase.Local("send_receipt", func(_ context.Context, _ pgx.Tx, in *in) (phase.Result, error) {
			runs.add(runs.phases, "send_receipt "+in.Key)
			return phase.JSON(http.StatusCreated, in.State), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	if w.Definition() != ridesDefinition {
		t.Fatalf("the test's workflow has definition %s, want %s as its keys recorded", w.Definition(), ridesDefinition)
	}
	return w
}

func TestUpgradeFromAnOldSchemaFinishesKeysInFlightWithoutRepeatingWork(t *testing.T) {
	t.Parallel()
	latest := len(atomicphase.Migrations())
	for _, from := range []struct {
		name    string
		version int
	}{
		// The oldest install Migrate adopts: migration 001's statements,
		// with no version table, and keys with the first generation of
		// fingerprint and no definition.
		{"before versioned migrations", 0},
		// The first version whose keys record their definition and the
		// call that may be under way, with the second generation.
		{"version 5", 5},
		// The schema of the release before this one.
		{"previous version", latest - 1},
	} {
		t.Run(from.name, func(t *testing.T) {
			t.Parallel()
			upgradeWithKeysInFlight(t, from.version)
		})
	}
}

// upgradeWithKeysInFlight sets up the schema of version from, writes
// upgradeKeys as its release did, migrates to the latest version, and has
// a client of today answer, resume and complete the keys.
func upgradeWithKeysInFlight(t *testing.T, from int) {
	ctx := context.Background()
	dsn := emptyDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if from == 0 {
		mustExec(t, conn, atomicphase.Migrations()[0].SQL)
	} else if _, err := atomicphase.MigrateWith(ctx, conn, atomicphase.Migrations()[:from]); err != nil {
		t.Fatal(err)
	}
	for _, k := range upgradeKeys {
		insertOldKey(t, conn, from, k)
	}
	if err := atomicphase.Migrate(ctx, conn); err != nil {
		t.Fatalf("migrate from version %d with keys in flight: %v", from, err)
	}
	if got, want := version(t, conn), len(atomicphase.Migrations()); got != want {
		t.Fatalf("version after Migrate = %d, want %d", got, want)
	}

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	runs := &upgradeRuns{phases: map[string]int{}, charges: map[string]int{}}
	w := upgradeWorkflow(t, runs)
	c, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, w)
	if err != nil {
		t.Fatal(err)
	}
	h, err := phase.Handler(c, w, phase.HTTPConfig[rideReq]{Tenant: func(*http.Request) (string, error) { return "acme", nil }})
	if err != nil {
		t.Fatal(err)
	}
	post := func(key string, amount int) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/rides", strings.NewReader(fmt.Sprintf(`{"amount":%d,"currency":"usd"}`, amount)))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(keyrow.HeaderName, key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}

	// The finished key replays its stored response byte for byte, and
	// still refuses another payload.
	rec := post("finished", 500)
	if rec.Code != http.StatusCreated || rec.Body.String() != finishedBody || rec.Header().Get("Location") != finishedLocation ||
		rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get(phase.ReplayedHeader) != "true" {
		t.Errorf("retry of the finished key: %d %v %q, want the stored 201 %q replayed", rec.Code, rec.Header(), rec.Body, finishedBody)
	}
	if rec := post("finished", 501); rec.Code != http.StatusUnprocessableEntity {
		t.Errorf("the finished key with another payload: %d %s, want 422", rec.Code, rec.Body)
	}

	// The key whose charge committed resumes after it, then replays.
	const chargedBody = `{"ride_id":2,"charge_id":"ch_2"}` + "\n"
	if rec := post("charged", 200); rec.Code != http.StatusCreated || rec.Body.String() != chargedBody || rec.Header().Get(phase.ReplayedHeader) != "" {
		t.Errorf("retry of the key whose charge committed: %d %q, want 201 %q from the resumed run", rec.Code, rec.Body, chargedBody)
	}
	if rec := post("charged", 200); rec.Code != http.StatusCreated || rec.Body.String() != chargedBody || rec.Header().Get(phase.ReplayedHeader) != "true" {
		t.Errorf("second retry of the key whose charge committed: %d %q, want its replay", rec.Code, rec.Body)
	}

	// The key on hold stays on hold, for a retry and for the completer.
	if rec := post("held", 400); rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "request-on-hold") {
		t.Errorf("retry of the key on hold: %d %s, want 409 request-on-hold", rec.Code, rec.Body)
	}

	// The completer finishes the key whose ride committed, with no client,
	// sending its charge under the downstream key its stored fingerprint
	// derives.
	if _, err := c.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	const rideCreatedBody = `{"ride_id":3,"charge_id":"ch_ride-created"}` + "\n"
	if rec := post("ride-created", 300); rec.Code != http.StatusCreated || rec.Body.String() != rideCreatedBody || rec.Header().Get(phase.ReplayedHeader) != "true" {
		t.Errorf("retry of the key the completer finished: %d %q, want the replay of 201 %q", rec.Code, rec.Body, rideCreatedBody)
	}

	generation := 0
	if from >= 5 {
		generation = 1
	}
	wantCharges := map[string]int{rideCreatedDownstreamKey[generation]: 1}
	wantPhases := map[string]int{"send_receipt charged": 1, "charge ride-created": 1, "send_receipt ride-created": 1}
	runs.mu.Lock()
	defer runs.mu.Unlock()
	if !maps.Equal(runs.charges, wantCharges) {
		t.Errorf("charges sent, by downstream key: %v, want %v", runs.charges, wantCharges)
	}
	if !maps.Equal(runs.phases, wantPhases) {
		t.Errorf("phases run: %v, want %v: a committed phase ran again, or one that was due did not", runs.phases, wantPhases)
	}

	var hold, point, pending string
	var leases int
	err = conn.QueryRow(ctx, `SELECT coalesce(hold, ''), recovery_point, coalesce(call_pending, ''),
		(SELECT count(*) FROM idempotency_keys WHERE lock_token IS NOT NULL)
		FROM idempotency_keys WHERE idempotency_key = 'held'`).Scan(&hold, &point, &pending, &leases)
	if err != nil {
		t.Fatal(err)
	}
	wantPending := ""
	if from >= 5 {
		wantPending = "charge"
	}
	if hold != "unknown" || point != "create_ride" || pending != wantPending || leases != 0 {
		t.Errorf("the key on hold: hold %q at %q, pending call %q, and %d leases left; want unknown at create_ride, pending %q, no lease",
			hold, point, pending, leases, wantPending)
	}
}
