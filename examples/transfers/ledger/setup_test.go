package ledger_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/transfers/ledger"
	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/recovery"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// noKeepAlive is a client that opens a connection per request. Go's
// transport resends a request that carries an Idempotency-Key when a reused
// connection closes before any byte of the answer, as a crashed request's
// does; that is safe, but it would hide the crashes these tests inject.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

type env struct {
	db       *pgxpool.Pool
	provider *payoutprovider.Server
	wf       *phase.Workflow[ledger.Transfer, ledger.State]
	payouts  *payoutprovider.Client
	client   *phase.Client
	events   *phasetest.Events
	// api serves the ledger; each request crashes at each fault point with
	// probability crashRate.
	api       *httptest.Server
	crashRate float64
}

// setup returns a migrated database with the ledger and the payout
// provider, the transfers workflow registered with a client, and the
// ledger's API. The client's background services are not started; its
// completer takes any unfinished key that is free, without backoff.
func setup(t testing.TB, crashRate float64) *env {
	t.Helper()
	ctx := context.Background()
	db := pgtest.PoolWith(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 24
	})
	if err := ledger.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := payoutprovider.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	e := &env{db: db, provider: payoutprovider.New(db, payoutprovider.Config{Logger: quiet}), events: &phasetest.Events{}, crashRate: crashRate}
	providerSrv := httptest.NewServer(e.provider)
	t.Cleanup(providerSrv.Close)
	var err error
	e.payouts = payoutprovider.NewClient(providerSrv.URL, noKeepAlive)
	if e.wf, err = ledger.Transfers(e.payouts); err != nil {
		t.Fatal(err)
	}
	e.client, err = phase.NewClient(db, &phase.Config{
		Logger:    quiet,
		Hooks:     []phase.Hook{e.events},
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1, MaxAttempts: 1000, Interval: 10 * time.Millisecond},
		Reaper:    recovery.ReaperConfig{Interval: -1},
	}, e.wf)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ledger.Handler(db, e.client, e.wf)
	if err != nil {
		t.Fatal(err)
	}
	e.api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(phase.WithInjector(r.Context(), crashes(e.crashRate))))
	}))
	t.Cleanup(e.api.Close)
	return e
}

// crashes returns an injector that crashes a run at each fault point with
// probability rate, as a process killed at a random moment would stop.
func crashes(rate float64) phase.Injector {
	return phase.InjectorFunc(func(context.Context, phase.Point) error {
		if rate > 0 && rand.Float64() < rate {
			return phase.ErrCrash
		}
		return nil
	})
}

func (e *env) open(t testing.TB, owner, currency string, deposit int64) ledger.Account {
	t.Helper()
	a, err := ledger.Open(context.Background(), e.db, owner, currency, deposit)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (e *env) account(t testing.TB, owner string, id int64) ledger.Account {
	t.Helper()
	accounts, err := ledger.Accounts(context.Background(), e.db, owner)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range accounts {
		if a.ID == id {
			return a
		}
	}
	t.Fatalf("%s has no account %d", owner, id)
	return ledger.Account{}
}

// verify fails t unless every ledger invariant holds.
func (e *env) verify(t testing.TB) *ledger.Report {
	t.Helper()
	r, err := ledger.Verify(context.Background(), e.db)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		var b bytes.Buffer
		_ = r.Write(&b)
		t.Fatalf("invariants violated:\n%s", b.String())
	}
	return r
}

// answer is an HTTP answer, read in full.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) replayed() bool { return a.header.Get(phase.ReplayedHeader) == "true" }

func (a answer) problem(t testing.TB) ledger.Problem {
	t.Helper()
	var p ledger.Problem
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatalf("%d %q is not a problem: %v", a.status, a.body, err)
	}
	return p
}

func (a answer) receipt(t testing.TB) ledger.Receipt {
	t.Helper()
	var r ledger.Receipt
	if a.status != http.StatusCreated || json.Unmarshal(a.body, &r) != nil {
		t.Fatalf("answer %d %q, want 201 with a receipt", a.status, a.body)
	}
	return r
}

// post sends tr once as owner under key. A dropped connection (a crashed
// server) is returned as an error.
func (e *env) post(t testing.TB, owner, key string, tr ledger.Transfer) (answer, error) {
	t.Helper()
	body, err := json.Marshal(tr)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, e.api.URL+"/transfers", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+owner)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// postOnce sends tr once and fails t if the connection drops.
func (e *env) postOnce(t testing.TB, owner, key string, tr ledger.Transfer) answer {
	t.Helper()
	a, err := e.post(t, owner, key, tr)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// send sends tr under key until it gets a final answer, as a client that
// keeps its key would. After a dropped connection it frees the lease the
// crashed run left behind, which is what the lease's expiry would do, so
// the test need not wait out the TTL; after a 409 or a 5xx it simply tries
// again.
func (e *env) send(t testing.TB, owner, key string, tr ledger.Transfer) (final answer, attempts int) {
	t.Helper()
	ctx := context.Background()
	for attempts = 1; attempts <= 500; attempts++ {
		a, err := e.post(t, owner, key, tr)
		switch {
		case err != nil:
			if _, err := e.client.Unlock(ctx, owner, key); err != nil {
				t.Error(err)
				return answer{}, attempts
			}
		case a.status == http.StatusConflict || a.status >= 500:
			time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
		default:
			return a, attempts
		}
	}
	t.Errorf("%s: no final answer after %d attempts", key, attempts)
	return answer{}, attempts
}

// transfer returns the id, status and payout id of the transfer made under
// owner's key; found is false when the key made none.
func (e *env) transfer(t testing.TB, owner, key string) (id int64, status, payoutID string, found bool) {
	t.Helper()
	err := e.db.QueryRow(context.Background(),
		`SELECT id, status, coalesce(payout_id, '') FROM ledger_transfers WHERE owner = $1 AND idempotency_key = $2`,
		owner, key).Scan(&id, &status, &payoutID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return id, status, payoutID, true
}

// payoutsFor returns the provider's payouts for a transfer.
func (e *env) payoutsFor(t testing.TB, transferID int64) []payoutprovider.Payout {
	t.Helper()
	all, err := payoutprovider.Payouts(context.Background(), e.db)
	if err != nil {
		t.Fatal(err)
	}
	var out []payoutprovider.Payout
	for _, p := range all {
		if p.Reference == strconv.FormatInt(transferID, 10) {
			out = append(out, p)
		}
	}
	return out
}
