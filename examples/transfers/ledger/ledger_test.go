package ledger_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/examples/transfers/ledger"
	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/recovery"
)

func TestCrashesAndPairedFaultsAtEveryPointSettleOncePerPath(t *testing.T) {
	t.Parallel()
	for _, external := range []bool{false, true} {
		name := "internal"
		if external {
			name = "external"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 0)
			from := e.open(t, "alice", "EUR", 1_000_000)
			to := e.open(t, "bob", "EUR", 0)
			const amount = 100
			settled := 0
			cfg := phasetest.Config[ledger.Transfer, ledger.State]{
				Client:   e.client,
				DB:       e.db,
				Workflow: e.wf,
				Tenant:   "alice",
				Request: func(string) ledger.Transfer {
					tr := ledger.Transfer{FromAccount: from.ID, Amount: amount, Currency: "EUR"}
					if external {
						tr.PayoutDestination = "dest_alice"
					} else {
						tr.ToAccount = to.ID
					}
					return tr
				},
				WithCompleter: true,
				// The ledger and the provider make the ids; the rest of the
				// receipt must not change.
				Compare: phasetest.IgnoreFields("transfer_id", "payout_id"),
				Check: func(t testing.TB, s phasetest.Scenario) {
					settled++
					id, status, payoutID, found := e.transfer(t, "alice", s.Key)
					if !found || status != "settled" {
						t.Fatalf("%s: transfer %d is %q (found %v), want settled", s.Key, id, status, found)
					}
					payouts := e.payoutsFor(t, id)
					switch {
					case !external && len(payouts) != 0:
						t.Fatalf("%s: internal transfer %d has %d payouts, want none", s.Key, id, len(payouts))
					case external && (len(payouts) != 1 || payouts[0].ID != payoutID || payouts[0].Status != payoutprovider.StatusPaid):
						t.Fatalf("%s: transfer %d (payout %q) has payouts %+v, want exactly that one, paid", s.Key, id, payoutID, payouts)
					}
					e.verify(t)
					// Every scenario so far moved its amount once, and no more.
					a := e.account(t, "alice", from.ID)
					if moved := int64(settled * amount); a.Balance != 1_000_000-moved || a.Held != 0 {
						t.Fatalf("%s: alice has %d (held %d) after %d transfers of %d", s.Key, a.Balance, a.Held, settled, amount)
					}
				},
			}
			t.Run("crashes", func(t *testing.T) { phasetest.CrashMatrix(t, cfg) })
			t.Run("pairs", func(t *testing.T) { phasetest.PairMatrix(t, cfg) })
		})
	}
}

func TestTwentyClientsWithCrashesRetriesAndCompleterConserveMoney(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, 0.03)
	if err := e.provider.SetFaults(payoutprovider.Faults{FailBeforeRate: 0.1, TimeoutAfterRate: 0.1}); err != nil {
		t.Fatal(err)
	}
	accounts := []ledger.Account{
		e.open(t, "alice", "EUR", 20_000),
		e.open(t, "alice", "EUR", 20_000),
		e.open(t, "bob", "EUR", 20_000),
		e.open(t, "carol", "EUR", 20_000),
		e.open(t, "carol", "USD", 20_000),
	}
	if err := e.client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.client.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})

	// The invariants hold at every committed state, not only at the end:
	// Verify reads one snapshot, so it runs against the traffic.
	verified := 0
	stopVerifying := make(chan struct{})
	var verifier sync.WaitGroup
	verifier.Go(func() {
		for {
			select {
			case <-stopVerifying:
				return
			default:
			}
			r, err := ledger.Verify(ctx, e.db)
			if err != nil || !r.OK() {
				var b bytes.Buffer
				if r != nil {
					_ = r.Write(&b)
				}
				t.Errorf("mid-traffic verify: %v\n%s", err, b.String())
				return
			}
			verified++
		}
	})

	const clients, transfersEach = 20, 8
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[string]int{}
		attempts int
		receipts []ledger.Receipt
	)
	for c := range clients {
		wg.Go(func() {
			for i := range transfersEach {
				from := accounts[rand.IntN(len(accounts))]
				tr := ledger.Transfer{FromAccount: from.ID, Amount: 1 + rand.Int64N(6_000), Currency: from.Currency}
				switch r := rand.Float64(); {
				case r < 0.05:
					tr.PayoutDestination = payoutprovider.ClosedDestination
				case r < 0.35:
					tr.PayoutDestination = fmt.Sprintf("dest_%s_%d", from.Owner, c)
				default:
					// Mostly to an account of the same currency; the
					// others are refused as a currency mismatch.
					for to := from; to.ID == from.ID || (to.Currency != from.Currency && rand.IntN(10) > 0); {
						to = accounts[rand.IntN(len(accounts))]
						tr.ToAccount = to.ID
					}
				}
				key := fmt.Sprintf("client-%02d-transfer-%02d", c, i)
				// Now and then the client sends the request twice at once.
				var twin answer
				var twins sync.WaitGroup
				if rand.IntN(8) == 0 {
					twins.Go(func() { twin, _ = e.send(t, from.Owner, key, tr) })
				}
				final, n := e.send(t, from.Owner, key, tr)
				twins.Wait()
				if twin.status != 0 && (twin.status != final.status || !bytes.Equal(twin.body, final.body)) {
					t.Errorf("%s: two sends answered %d %q and %d %q", key, final.status, final.body, twin.status, twin.body)
				}
				outcome := fmt.Sprint(final.status)
				if final.status == http.StatusCreated {
					mu.Lock()
					receipts = append(receipts, final.receipt(t))
					mu.Unlock()
				} else {
					outcome = final.problem(t).Type
				}
				// A client that sends again after the answer gets the same bytes.
				if rand.IntN(4) == 0 {
					again, _ := e.send(t, from.Owner, key, tr)
					if again.status != final.status || !bytes.Equal(again.body, final.body) || !again.replayed() {
						t.Errorf("%s: resend answered %d %q (replayed %v), want a replay of %d %q",
							key, again.status, again.body, again.replayed(), final.status, final.body)
					}
				}
				mu.Lock()
				outcomes[outcome]++
				attempts += n
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stopVerifying)
	verifier.Wait()
	if _, err := e.client.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	counts, err := e.client.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts.Finished != counts.Total() {
		t.Fatalf("keys left unfinished: %+v", counts)
	}
	report := e.verify(t)
	external := 0
	for _, r := range receipts {
		if r.PayoutID != "" {
			external++
		}
	}
	if report.Settled != len(receipts) || report.SettledExternal != external || report.InFlight != 0 {
		t.Fatalf("ledger has %d settled (%d external), %d in flight; clients got %d receipts (%d external)",
			report.Settled, report.SettledExternal, report.InFlight, len(receipts), external)
	}
	t.Logf("outcomes %v in %d attempts; %d crashes, %d serialization retries, %d provider faults; verified %d times during the traffic",
		outcomes, attempts, e.events.Count(keyrow.EventCrashed), e.events.Count(keyrow.EventRetried), e.provider.Stats().FaultsInjected, verified)
	if e.events.Count(keyrow.EventCrashed) == 0 {
		t.Error("no crash was injected; the test proved nothing about crashes")
	}
}

func TestInsufficientFundsIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	poor := e.open(t, "alice", "EUR", 500)
	bob := e.open(t, "bob", "EUR", 5_000)
	tr := ledger.Transfer{FromAccount: poor.ID, ToAccount: bob.ID, Amount: 800, Currency: "EUR"}

	first := e.postOnce(t, "alice", "rent", tr)
	p := first.problem(t)
	if first.status != http.StatusUnprocessableEntity || p.Type != ledger.ProblemInsufficientFunds || first.replayed() ||
		first.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("first answer %d %q, want a fresh 422 insufficient-funds problem", first.status, first.body)
	}
	// The account is topped up after the refusal; the key still answers as
	// it first did, because the refusal was the request's final answer.
	if a := e.postOnce(t, "bob", "gift", ledger.Transfer{FromAccount: bob.ID, ToAccount: poor.ID, Amount: 1_000, Currency: "EUR"}); a.status != http.StatusCreated {
		t.Fatalf("top-up: %d %q", a.status, a.body)
	}
	again := e.postOnce(t, "alice", "rent", tr)
	if again.status != first.status || !bytes.Equal(again.body, first.body) || !again.replayed() {
		t.Fatalf("retry answered %d %q (replayed %v), want the stored refusal %q byte for byte",
			again.status, again.body, again.replayed(), first.body)
	}
	if _, _, _, found := e.transfer(t, "alice", "rent"); found {
		t.Fatal("a refused transfer was recorded")
	}
	if a := e.account(t, "alice", poor.ID); a.Balance != 1_500 || a.Held != 0 {
		t.Fatalf("alice's account: balance %d, held %d; want 1500 and 0: the refusal moved nothing", a.Balance, a.Held)
	}
	e.verify(t)
}

func TestRefusedTransfersAreStoredAndMoveNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	eur := e.open(t, "alice", "EUR", 1_000)
	usd := e.open(t, "bob", "USD", 1_000)
	bobEUR := e.open(t, "bob", "EUR", 1_000)
	for _, tc := range []struct {
		name, owner string
		tr          ledger.Transfer
		status      int
		problem     string
	}{
		{"currency of the receiving account", "alice", ledger.Transfer{FromAccount: eur.ID, ToAccount: usd.ID, Amount: 10, Currency: "EUR"},
			http.StatusUnprocessableEntity, ledger.ProblemCurrencyMismatch},
		{"currency of the source account", "alice", ledger.Transfer{FromAccount: eur.ID, PayoutDestination: "dest_a", Amount: 10, Currency: "USD"},
			http.StatusUnprocessableEntity, ledger.ProblemCurrencyMismatch},
		{"someone else's account", "alice", ledger.Transfer{FromAccount: bobEUR.ID, ToAccount: eur.ID, Amount: 10, Currency: "EUR"},
			http.StatusNotFound, ledger.ProblemUnknownAccount},
		{"receiving account missing", "alice", ledger.Transfer{FromAccount: eur.ID, ToAccount: 999_999, Amount: 10, Currency: "EUR"},
			http.StatusNotFound, ledger.ProblemUnknownAccount},
	} {
		key := "refused-" + strings.ReplaceAll(tc.name, " ", "-")
		first := e.postOnce(t, tc.owner, key, tc.tr)
		if first.status != tc.status || first.problem(t).Type != tc.problem {
			t.Errorf("%s: %d %q, want %d %s", tc.name, first.status, first.body, tc.status, tc.problem)
		}
		if again := e.postOnce(t, tc.owner, key, tc.tr); !again.replayed() || !bytes.Equal(again.body, first.body) {
			t.Errorf("%s: retry %d %q, want the stored refusal replayed", tc.name, again.status, again.body)
		}
	}
	for _, a := range []ledger.Account{eur, usd, bobEUR} {
		if got := e.account(t, a.Owner, a.ID); got.Balance != 1_000 || got.Held != 0 {
			t.Errorf("account %d: balance %d, held %d; want 1000 and 0", a.ID, got.Balance, got.Held)
		}
	}
	if s := e.provider.Stats(); s.Requests != 0 {
		t.Errorf("the provider got %d requests for refused transfers", s.Requests)
	}
	e.verify(t)
}

func TestInvalidTransfersAreRefusedBeforeAnythingIsStored(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	a := e.open(t, "alice", "EUR", 1_000)
	b := e.open(t, "bob", "EUR", 1_000)
	for _, tc := range []struct {
		name  string
		tr    ledger.Transfer
		field string
	}{
		{"no source", ledger.Transfer{ToAccount: b.ID, Amount: 1, Currency: "EUR"}, "from_account"},
		{"zero amount", ledger.Transfer{FromAccount: a.ID, ToAccount: b.ID, Currency: "EUR"}, "amount"},
		{"bad currency", ledger.Transfer{FromAccount: a.ID, ToAccount: b.ID, Amount: 1, Currency: "EURO"}, "currency"},
		{"no destination", ledger.Transfer{FromAccount: a.ID, Amount: 1, Currency: "EUR"}, "to_account"},
		{"two destinations", ledger.Transfer{FromAccount: a.ID, ToAccount: b.ID, PayoutDestination: "dest_a", Amount: 1, Currency: "EUR"}, "to_account"},
		{"to itself", ledger.Transfer{FromAccount: a.ID, ToAccount: a.ID, Amount: 1, Currency: "EUR"}, "to_account"},
	} {
		got := e.postOnce(t, "alice", "invalid-"+strings.ReplaceAll(tc.name, " ", "-"), tc.tr)
		if p := got.problem(t); got.status != http.StatusUnprocessableEntity || p.Field != tc.field {
			t.Errorf("%s: %d %q, want 422 naming %s", tc.name, got.status, got.body, tc.field)
		}
	}
	var keys int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys`).Scan(&keys); err != nil || keys != 0 {
		t.Fatalf("%d keys stored for invalid requests (%v), want none", keys, err)
	}
}

func TestInternalTransferSkipsThePayoutPhase(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	a := e.open(t, "alice", "EUR", 1_000)
	b := e.open(t, "bob", "EUR", 0)
	r := e.postOnce(t, "alice", "lunch", ledger.Transfer{FromAccount: a.ID, ToAccount: b.ID, Amount: 250, Currency: "EUR"}).receipt(t)
	if r.PayoutID != "" || r.ToAccount != b.ID || r.Amount != 250 {
		t.Fatalf("receipt %+v, want 250 to account %d without a payout", r, b.ID)
	}
	if s := e.provider.Stats(); s.Requests != 0 {
		t.Fatalf("the provider got %d requests for an internal transfer, want none", s.Requests)
	}
	var phases []string
	for _, ev := range e.events.Of("lunch") {
		if ev.Phase != "" {
			phases = append(phases, ev.Phase)
		}
	}
	if want := []string{ledger.PhaseFundsHeld, ledger.PhaseSettled}; !slices.Equal(phases, want) {
		t.Fatalf("phases run: %v, want %v", phases, want)
	}
	if got := e.account(t, "bob", b.ID); got.Balance != 250 {
		t.Fatalf("bob has %d, want 250", got.Balance)
	}
	e.verify(t)
}

func TestExternalTransferCarriesItsIDsInTheWorkflowState(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	a := e.open(t, "alice", "EUR", 1_000)
	r := e.postOnce(t, "alice", "rent", ledger.Transfer{FromAccount: a.ID, PayoutDestination: "dest_landlord", Amount: 700, Currency: "EUR"}).receipt(t)
	info, err := e.client.Inspect(context.Background(), "alice", "rent")
	if err != nil {
		t.Fatal(err)
	}
	var state ledger.State
	if err := json.Unmarshal(info.State, &state); err != nil {
		t.Fatal(err)
	}
	if state.TransferID != r.TransferID || state.PayoutID != r.PayoutID || r.PayoutID == "" {
		t.Fatalf("state %+v, receipt %+v; want the transfer and payout ids in both", state, r)
	}
	payouts := e.payoutsFor(t, r.TransferID)
	if len(payouts) != 1 || payouts[0].ID != r.PayoutID || payouts[0].Amount != 700 || payouts[0].Destination != "dest_landlord" {
		t.Fatalf("provider payouts %+v, want one of 700 to dest_landlord", payouts)
	}
	if got := e.account(t, "alice", a.ID); got.Balance != 300 || got.Held != 0 || got.PaidOut != 700 {
		t.Fatalf("alice: %+v, want 300 left, 700 paid out", got)
	}
	e.verify(t)
}

func TestPayoutTimeoutIsRepeatedWithTheSameKeyAndPaysOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	a := e.open(t, "alice", "EUR", 1_000)
	if err := e.provider.SetFaults(payoutprovider.Faults{TimeoutAfter: 1, FailBefore: 1}); err != nil {
		t.Fatal(err)
	}
	tr := ledger.Transfer{FromAccount: a.ID, PayoutDestination: "dest_a", Amount: 400, Currency: "EUR"}
	// The provider fails before paying, then pays and drops the answer.
	for _, want := range []int{http.StatusServiceUnavailable, http.StatusServiceUnavailable} {
		if got := e.postOnce(t, "alice", "k1", tr); got.status != want || got.header.Get("Retry-After") == "" {
			t.Fatalf("answer %d %q, want %d with Retry-After", got.status, got.body, want)
		}
	}
	r := e.postOnce(t, "alice", "k1", tr).receipt(t)
	if payouts := e.payoutsFor(t, r.TransferID); len(payouts) != 1 || payouts[0].ID != r.PayoutID {
		t.Fatalf("payouts %+v, want exactly %s", payouts, r.PayoutID)
	}
	if s := e.provider.Stats(); s.Counts[payoutprovider.StatusPaid] != 1 || s.Replays != 1 || s.FaultsInjected != 2 {
		t.Fatalf("provider stats %+v, want one payout, replayed once, after two faults", s)
	}
	e.verify(t)
}

func TestRefusedPayoutGivesTheHoldBack(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	a := e.open(t, "alice", "EUR", 1_000)
	tr := ledger.Transfer{FromAccount: a.ID, PayoutDestination: payoutprovider.ClosedDestination, Amount: 600, Currency: "EUR"}
	first := e.postOnce(t, "alice", "k1", tr)
	p := first.problem(t)
	if first.status != http.StatusUnprocessableEntity || p.Type != ledger.ProblemPayoutFailed || p.TransferID == 0 {
		t.Fatalf("answer %d %q, want 422 payout-failed naming the transfer", first.status, first.body)
	}
	if again := e.postOnce(t, "alice", "k1", tr); !again.replayed() || !bytes.Equal(again.body, first.body) {
		t.Fatalf("retry %d %q, want the stored refusal", again.status, again.body)
	}
	if got := e.account(t, "alice", a.ID); got.Balance != 1_000 || got.Held != 0 || got.PaidOut != 0 {
		t.Fatalf("alice: %+v, want all 1000 back", got)
	}
	_, status, payoutID, _ := e.transfer(t, "alice", "k1")
	payouts := e.payoutsFor(t, p.TransferID)
	if status != "payout_failed" || len(payouts) != 1 || payouts[0].ID != payoutID || payouts[0].Status != payoutprovider.StatusFailed {
		t.Fatalf("transfer %s with payout %q, provider %+v; want one failed payout recorded", status, payoutID, payouts)
	}
	e.verify(t)
}

func TestVerifyCatchesABrokenLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, 0)
	a := e.open(t, "alice", "EUR", 1_000)
	e.postOnce(t, "alice", "k1", ledger.Transfer{FromAccount: a.ID, PayoutDestination: "dest_a", Amount: 100, Currency: "EUR"}).receipt(t)
	e.verify(t)
	for _, tc := range []struct {
		name, breakSQL, undoSQL string
		broken                  []string
	}{
		{"money from nowhere",
			`UPDATE ledger_accounts SET balance = balance + 1 WHERE id = $1`,
			`UPDATE ledger_accounts SET balance = balance - 1 WHERE id = $1`,
			[]string{"double entry", "money conserved"}},
		{"a second payout",
			`INSERT INTO payoutprovider_payouts (id, amount, currency, destination, reference, status, idempotency_key)
			 SELECT 'po_twin', amount, currency, payout_destination, id::text, 'paid', 'other' FROM ledger_transfers WHERE from_account = $1`,
			`DELETE FROM payoutprovider_payouts WHERE id = 'po_twin' AND $1::bigint > 0`,
			[]string{"one payout per external transfer"}},
		{"a hold left behind",
			`UPDATE ledger_accounts SET held = held + 5, balance = balance - 5 WHERE id = $1`,
			`UPDATE ledger_accounts SET held = held - 5, balance = balance + 5 WHERE id = $1`,
			[]string{"double entry", "no hold left behind"}},
	} {
		if _, err := e.db.Exec(ctx, tc.breakSQL, a.ID); err != nil {
			t.Fatal(err)
		}
		r, err := ledger.Verify(ctx, e.db)
		if err != nil {
			t.Fatal(err)
		}
		failed := map[string]bool{}
		for _, c := range r.Checks {
			if !c.OK {
				failed[c.Name] = true
			}
		}
		if want := tc.broken; !slices.Equal(slices.Sorted(maps.Keys(failed)), want) {
			t.Errorf("%s: failed checks %v, want %v", tc.name, slices.Sorted(maps.Keys(failed)), want)
		}
		if _, err := e.db.Exec(ctx, tc.undoSQL, a.ID); err != nil {
			t.Fatal(err)
		}
	}
	e.verify(t)
}

func TestOtherPathsMethodsAndCallersAreAnsweredAsProblems(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	for _, tc := range []struct {
		method, path, auth string
		status             int
		allow              string
	}{
		{http.MethodGet, "/transfers", "Bearer alice", http.StatusMethodNotAllowed, "POST"},
		{http.MethodDelete, "/accounts", "Bearer alice", http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodGet, "/accounts", "", http.StatusUnauthorized, ""},
		{http.MethodGet, "/transfers/1", "Bearer alice", http.StatusNotFound, ""},
		{http.MethodGet, "/", "Bearer alice", http.StatusNotFound, ""},
	} {
		req, err := http.NewRequest(tc.method, e.api.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		res, err := noKeepAlive.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var p ledger.Problem
		err = json.NewDecoder(res.Body).Decode(&p)
		res.Body.Close()
		if res.StatusCode != tc.status || res.Header.Get("Content-Type") != "application/problem+json" || err != nil ||
			p.Status != tc.status || res.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d %s %+v (Allow %q), want a %d problem (Allow %q)", tc.method, tc.path,
				res.StatusCode, res.Header.Get("Content-Type"), p, res.Header.Get("Allow"), tc.status, tc.allow)
		}
	}
}

// TestAddingALimitCheckConvergesForTransfersInFlight deploys a definition of
// the transfers workflow with a limit check between the hold and the payout,
// which adopts the first definition, over external transfers crashed at
// every point of the first: each settles once, with one paid payout.
func TestAddingALimitCheckConvergesForTransfersInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	from := e.open(t, "alice", "EUR", 1_000_000)
	const amount = 100
	checked, err := ledger.TransfersWith(e.payouts,
		phase.Local("limits_checked", func(ctx context.Context, tx pgx.Tx, in *phase.Input[ledger.Transfer, ledger.State]) (phase.Result, error) {
			var held int64
			err := tx.QueryRow(ctx, `SELECT held FROM ledger_accounts WHERE id = $1`, in.Req.FromAccount).Scan(&held)
			return phase.Next(), err
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := checked.Adopt(ledger.WorkflowName, e.wf.Definition(), nil); err != nil {
		t.Fatal(err)
	}
	upgraded, err := phase.NewClient(e.db, &phase.Config{Logger: quiet,
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, checked)
	if err != nil {
		t.Fatal(err)
	}
	request := func(string) ledger.Transfer {
		return ledger.Transfer{FromAccount: from.ID, Amount: amount, Currency: "EUR", PayoutDestination: "dest_alice"}
	}
	phasetest.UpgradeMatrix(t,
		phasetest.Config[ledger.Transfer, ledger.State]{Client: e.client, DB: e.db, Workflow: e.wf, Tenant: "alice", Request: request},
		phasetest.Config[ledger.Transfer, ledger.State]{Client: upgraded, DB: e.db, Workflow: checked, Tenant: "alice", Request: request,
			WithCompleter: true, Compare: phasetest.IgnoreFields("transfer_id", "payout_id"),
			Check: func(t testing.TB, s phasetest.Scenario) {
				id, status, payoutID, found := e.transfer(t, "alice", s.Key)
				payouts := e.payoutsFor(t, id)
				if !found || status != "settled" || len(payouts) != 1 || payouts[0].ID != payoutID || payouts[0].Status != payoutprovider.StatusPaid {
					t.Fatalf("%s: transfer %d is %q with payouts %+v, want settled with its one payout paid", s.Key, id, status, payouts)
				}
			}})
	e.verify(t)
}
