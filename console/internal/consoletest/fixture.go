package consoletest

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/console"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// Hostile values that clients control: each sets window.pwned if a page
// ever runs it.
const (
	HostileTenant = `<script>window.pwned="tenant"</script>`
	HostileKey    = `"><img src=x onerror="window.pwned='key'">`
	HostileURLKey = `javascript:window.pwned='url'`
	HostileNote   = `</pre><script>window.pwned="body"</script><a href="javascript:window.pwned='link'">x</a>`
	// HostileBidiTenant reads "acmeexe.jpg" where a right-to-left
	// override is obeyed.
	HostileBidiTenant = "acme\u202Egpj.exe"
)

// Order is the fixture workflow's request.
type Order struct {
	Item   string `json:"item"`
	Amount int    `json:"amount"`
	Note   string `json:"note,omitempty"`
}

// Charge is what the provider returns, and what an operator gives when a
// charge happened.
type Charge struct {
	ChargeID string `json:"charge_id"`
}

type state struct {
	ChargeID string `json:"charge_id,omitempty"`
}

// Fixture is a database holding keys in every state, and a client with
// their workflow registered.
type Fixture struct {
	Pool   *pgxpool.Pool
	Client *phase.Client
	// UnknownKey is the key of tenant acme whose charge awaits a
	// resolution.
	UnknownKey string
}

// New returns a database with keys of the "payments" workflow in every
// state (two finished, one in flight, one waiting, one stuck, one held as
// unknown, one dead) and four with hostile tenants, keys and bodies.
func New(t testing.TB) *Fixture {
	t.Helper()
	ctx := context.Background()
	db := pgtest.Pool(t)
	provider := func(ctx context.Context, in *phase.Input[Order, state]) (Charge, error) {
		switch in.Req.Item {
		case "lost":
			return Charge{}, phase.MaybeHappened(errors.New("the provider timed out after the request was sent"))
		case "declined":
			return Charge{}, errors.New("card declined: <b>insufficient funds</b>")
		}
		return Charge{ChargeID: "ch_" + in.Key}, nil
	}
	w, err := phase.NewWorkflow("payments",
		phase.Local("order_created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, state]) (phase.Result, error) {
			return phase.Next(), nil
		}),
		phase.Foreign("charged", provider, func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, state], c Charge) (phase.Result, error) {
			in.State.ChargeID = c.ChargeID
			return phase.Next(), nil
		}),
		phase.Local("receipt_sent", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Order, state]) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, map[string]any{"charge": in.State.ChargeID, "item": in.Req.Item, "note": in.Req.Note}), nil
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(db, &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}, w)
	if err != nil {
		t.Fatal(err)
	}
	f := &Fixture{Pool: db, Client: c, UnknownKey: "order-lost"}
	runs := []struct {
		tenant, key string
		req         Order
	}{
		{"acme", "order-1", Order{Item: "lamp", Amount: 300}},
		{"acme", "order-2", Order{Item: "desk", Amount: 9000}},
		{"acme", f.UnknownKey, Order{Item: "lost", Amount: 1200}},
		{"globex", "order-declined", Order{Item: "declined", Amount: 50}},
		{HostileTenant, "order-h1", Order{Item: "lamp", Amount: 1, Note: HostileNote}},
		{"acme", HostileKey, Order{Item: "lamp", Amount: 2, Note: HostileNote}},
		{"acme", HostileURLKey, Order{Item: "lost", Amount: 3, Note: HostileNote}},
		{HostileBidiTenant, "order-bidi", Order{Item: "lamp", Amount: 4, Note: "\u202Eevil"}},
	}
	for _, r := range runs {
		// Failures are the point for some of them.
		_, _ = w.Run(ctx, c, r.tenant, r.key, r.req)
	}
	// The declined key failed and is runnable; the completer gave up on
	// another; one is stuck, one in flight.
	exec := func(sql string, args ...any) {
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []struct{ tenant, key string }{{"acme", "order-dead"}, {"acme", "order-stuck"}, {"acme", "order-in-flight"}} {
		params := []byte(`{"item":"lamp","amount":5}`)
		fp, err := keyrow.Fingerprint("payments", params)
		if err != nil {
			t.Fatal(err)
		}
		_, row, err := store.Acquire(ctx, db, store.Request{Tenant: r.tenant, Key: r.key, Workflow: "payments",
			Fingerprint: fp, Params: params, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		switch r.key {
		case "order-dead":
			exec(`UPDATE idempotency_keys SET hold = 'dead', lock_token = NULL, lock_expires_at = NULL, locked_at = NULL,
			      failures = 5, last_error = 'phase charged: provider unavailable' WHERE id = $1`, row.ID)
		case "order-stuck":
			exec(`UPDATE idempotency_keys SET lock_token = NULL, lock_expires_at = NULL, locked_at = NULL,
			      last_run_at = now() - interval '20 minutes' WHERE id = $1`, row.ID)
		}
	}
	return f
}

// Users maps the user cookie's values to what the fixture's authorizer
// lets them do: alice acts, bob reads, anyone else is refused.
var Users = map[string]console.Access{"alice": console.Act, "bob": console.Read}

// UserCookie names the cookie the fixture's authorizer reads.
const UserCookie = "user"

// Authorizer lets in the users of Users by the user cookie.
var Authorizer = console.AuthorizerFunc(func(r *http.Request) (console.Principal, error) {
	c, err := r.Cookie(UserCookie)
	if err != nil {
		return console.Principal{}, err
	}
	return console.Principal{Name: c.Value, Access: Users[c.Value]}, nil
})

// Handler returns the console over the fixture, mounted at /console/ as an
// application would mount it, and /as?user=NAME, which signs the browser
// in as NAME.
func (f *Fixture) Handler(t testing.TB, readOnly bool) http.Handler {
	t.Helper()
	h, err := console.New(console.Config{Client: f.Client, Authorizer: Authorizer, ReadOnly: readOnly, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", h))
	mux.HandleFunc("/as", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: UserCookie, Value: r.URL.Query().Get("user"), Path: "/"})
		http.Redirect(w, r, "/console/", http.StatusSeeOther)
	})
	return mux
}
