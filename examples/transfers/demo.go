package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	mathrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/exampleprog"
	"github.com/atomicphase/atomicphase/examples/transfers/ledger"
	"github.com/atomicphase/atomicphase/examples/transfers/payoutprovider"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// The demo's chaos. A crashed request's key is resumed once its lease
// expires, by its client's retry or by the completer; the short lease keeps
// the demo short.
const (
	demoLeaseTTL = 2 * time.Second
	// demoCrashRate is the probability that a request crashes at each
	// fault point it passes (about a dozen for an external transfer).
	demoCrashRate = 0.02
	// demoFinishTimeout bounds the wait, after the traffic, for every
	// transfer to finish.
	demoFinishTimeout = 30 * time.Second
)

var demoFaults = payoutprovider.Faults{
	FailBeforeRate:   0.1,
	TimeoutAfterRate: 0.1,
	Delay:            5 * time.Millisecond,
}

func demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := exampleprog.Flags("transfers", usage+`
The demo opens five accounts (three owners, two currencies) and runs the ledger API, the
fake payout provider and the completer in one process. Concurrent clients send
random transfers (internal, paid out, some refused) for the given duration,
some twice at once and some again after their answer, while the API crashes at
random fault points (lease 2s), the payout provider fails before paying or
drops its answer after paying, and transfers between the same accounts
contend. Then the faults stop, every transfer is brought to its end, and the
ledger's invariants are checked and printed; the exit status is 1 if one fails.
Its database is throwaway unless -database-url or DATABASE_URL names one, which
'transfers verify' can check again afterwards.`, stderr)
	dbURL := exampleprog.DatabaseURL(fs, exampleprog.DatabaseUsage)
	duration := fs.Duration("duration", 10*time.Second, "how long the clients start new transfers")
	concurrency := fs.Int("concurrency", 8, "how many clients send transfers at once")
	if err := exampleprog.Parse(fs, args); err != nil {
		return err
	}
	if *duration <= 0 || *concurrency <= 0 {
		fmt.Fprintln(stderr, "-duration and -concurrency must be positive")
		return exampleprog.ErrUsage
	}
	db, closeDB, err := database(ctx, *dbURL, migrateAll, stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	// Errors only: the demo's crashes and faults are expected, and counted.
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	events := &tally{}

	// One connection per request for the clients: Go's transport resends a
	// request carrying an Idempotency-Key by itself when a reused
	// connection closes before any byte of the answer, as a crashed
	// request's does. That is safe, but it would hide most of the injected
	// crashes from the counts. The payout calls keep their connections: the
	// provider's drops come after the answer's first line, which the
	// transport never resends.
	oneConnPerRequest := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

	provider := payoutprovider.New(db, payoutprovider.Config{Logger: logger})
	if err := provider.SetFaults(demoFaults); err != nil {
		return err
	}
	providerURL, stopProvider, err := exampleprog.Listen("127.0.0.1:0", provider)
	if err != nil {
		return err
	}
	defer stopProvider()

	transfers, err := ledger.Transfers(payoutprovider.NewClient(providerURL, nil))
	if err != nil {
		return err
	}
	client, err := phase.NewClient(db, &phase.Config{
		LeaseTTL: demoLeaseTTL,
		Logger:   logger,
		Hooks:    []phase.Hook{events},
		Completer: recovery.CompleterConfig{
			Interval: 200 * time.Millisecond, StuckAfter: 3 * time.Second,
			Backoff: 500 * time.Millisecond, MaxBackoff: 2 * time.Second, MaxAttempts: 100,
		},
		// Nothing in the demo is old enough to reap.
		Reaper: recovery.ReaperConfig{Interval: -1},
	}, transfers)
	if err != nil {
		return err
	}
	h, err := ledger.Handler(db, client, transfers)
	if err != nil {
		return err
	}
	var chaos atomic.Bool
	chaos.Store(true)
	apiURL, stopAPI, err := exampleprog.Listen("127.0.0.1:0", withCrashes(h, demoCrashRate, &chaos))
	if err != nil {
		return err
	}
	defer stopAPI()

	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.Background()) //nolint:errcheck // stopped below on success

	accounts, err := openDemoAccounts(ctx, db)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d clients for %v; crashes at %.0f%% of fault points, lease %v; payout provider failing %.0f%% before paying and dropping %.0f%% of answers after paying\n",
		*concurrency, *duration, 100*demoCrashRate, demoLeaseTTL, 100*demoFaults.FailBeforeRate, 100*demoFaults.TimeoutAfterRate)
	fmt.Fprintf(stdout, "accounts: %s\n\n", describe(accounts))

	t := &traffic{api: apiURL, http: oneConnPerRequest, accounts: accounts, prefix: "demo-" + strings.ToLower(rand.Text()[:8]),
		outcomes: map[string]int{}}
	stopProgress := exampleprog.Progress(stderr, t.progressLine)
	t.run(ctx, *duration, *concurrency)
	stopProgress()
	if ctx.Err() != nil {
		return ctx.Err()
	}

	// The chaos stops; the clients have their answers or gave up, and the
	// completer finishes what they left.
	chaos.Store(false)
	if err := provider.SetFaults(payoutprovider.Faults{}); err != nil {
		return err
	}
	unfinished, err := waitFinished(ctx, client, demoFinishTimeout)
	if err != nil {
		return err
	}
	if err := client.Stop(ctx); err != nil {
		return err
	}

	report, err := ledger.Verify(ctx, db)
	if err != nil {
		return err
	}
	report.Checks = append(report.Checks, t.checks(unfinished)...)
	t.write(stdout)
	events.write(stdout, provider.Stats())
	after, err := accountsAfter(ctx, db, accounts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "accounts: %s\n\n", describe(after))
	if err := report.Write(stdout); err != nil {
		return err
	}
	if *dbURL == "" {
		fmt.Fprintln(stdout, "\nThe ledger was in a throwaway Postgres, gone with the demo. To check a ledger again with\n"+
			"'transfers verify', run the demo with -database-url URL (or DATABASE_URL), then verify with the same URL.")
	} else {
		fmt.Fprintln(stdout, "\nThe ledger stays in the database: 'transfers verify' with the same URL checks it again.")
	}
	if !report.OK() {
		return errInvariant
	}
	return nil
}

// withCrashes runs h with an injector that, while enabled, crashes each
// request at each fault point with probability rate: the run stops as a
// killed process would, its lease left to expire, and the client's
// connection is dropped without an answer.
func withCrashes(h http.Handler, rate float64, enabled *atomic.Bool) http.Handler {
	crash := phase.InjectorFunc(func(context.Context, phase.Point) error {
		if enabled.Load() && mathrand.Float64() < rate {
			return phase.ErrCrash
		}
		return nil
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(phase.WithInjector(r.Context(), crash)))
	})
}

// waitFinished waits until no idempotency key is unfinished, or timeout,
// and returns how many are left.
func waitFinished(ctx context.Context, client *phase.Client, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, err := client.Counts(ctx)
		if err != nil {
			return 0, err
		}
		left := c.Total() - c.Finished
		if left == 0 || time.Now().After(deadline) {
			return left, nil
		}
		select {
		case <-ctx.Done():
			return left, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func accountsAfter(ctx context.Context, db *pgxpool.Pool, before []ledger.Account) ([]ledger.Account, error) {
	var after []ledger.Account
	seen := map[string]bool{}
	for _, a := range before {
		if seen[a.Owner] {
			continue
		}
		seen[a.Owner] = true
		mine, err := ledger.Accounts(ctx, db, a.Owner)
		if err != nil {
			return nil, err
		}
		for _, m := range mine {
			for _, b := range before {
				if b.ID == m.ID {
					after = append(after, m)
				}
			}
		}
	}
	return after, nil
}

func describe(accounts []ledger.Account) string {
	parts := make([]string, len(accounts))
	for i, a := range accounts {
		parts[i] = fmt.Sprintf("#%d %s %d %s", a.ID, a.Owner, a.Balance, a.Currency)
		if a.PaidOut > 0 || a.Held > 0 {
			parts[i] += fmt.Sprintf(" (%d paid out", a.PaidOut)
			if a.Held > 0 {
				parts[i] += fmt.Sprintf(", %d held", a.Held)
			}
			parts[i] += ")"
		}
	}
	return strings.Join(parts, ", ")
}

// traffic is the demo's clients: each sends random transfers, one at a
// time, and retries each with its Idempotency-Key until it has a final
// answer.
type traffic struct {
	api      string
	http     *http.Client
	accounts []ledger.Account
	// prefix starts every key, so runs against one database never share
	// keys.
	prefix string
	// giveUp is when clients stop retrying and leave their transfer to the
	// completer.
	giveUp time.Time

	mu        sync.Mutex
	outcomes  map[string]int
	transfers int
	requests  int
	dropped   int // connections dropped by a crash
	conflicts int // 409: the key was in flight or its lease not yet expired
	retryable int // 5xx: stopped part-way, safe to retry
	twins     int // sent twice at once
	resends   int // sent again after the answer
	// unequal describes the duplicates that did not get the first answer.
	unequal []string
	gaveUp  int // transfers whose client went away before the answer
}

func (t *traffic) run(ctx context.Context, duration time.Duration, clients int) {
	stop := time.Now().Add(duration)
	t.giveUp = stop.Add(demoFinishTimeout / 2)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop) && ctx.Err() == nil; i++ {
				t.transfer(ctx, fmt.Sprintf("%s-c%02d-%04d", t.prefix, c, i))
			}
		})
	}
	wg.Wait()
}

// transfer sends one random transfer under key until it is answered.
func (t *traffic) transfer(ctx context.Context, key string) {
	from := t.accounts[mathrand.IntN(len(t.accounts))]
	tr := ledger.Transfer{FromAccount: from.ID, Amount: 1 + mathrand.Int64N(8_000), Currency: from.Currency}
	if mathrand.IntN(10) == 0 {
		tr.Amount = 40_000 + mathrand.Int64N(40_000) // often more than is left
	}
	switch r := mathrand.Float64(); {
	case r < 0.03:
		tr.PayoutDestination = payoutprovider.ClosedDestination
	case r < 0.25:
		// Smaller, so that payouts do not drain the ledger in a minute.
		tr.PayoutDestination = "dest_" + from.Owner
		tr.Amount = 1 + tr.Amount/4
	default:
		// Mostly to an account in the same currency; the rest is refused
		// as a currency mismatch.
		for to := from; to.ID == from.ID || (to.Currency != from.Currency && mathrand.IntN(10) > 0); {
			to = t.accounts[mathrand.IntN(len(t.accounts))]
			tr.ToAccount = to.ID
		}
	}
	body, _ := json.Marshal(tr) // a struct of strings and ints always encodes

	var twin answer
	var twins sync.WaitGroup
	if mathrand.IntN(10) == 0 {
		twins.Go(func() { twin = t.send(ctx, from.Owner, key, body) })
	}
	first := t.send(ctx, from.Owner, key, body)
	twins.Wait()
	if first.status == 0 {
		t.count(func() { t.gaveUp++ })
		return // the completer finishes it
	}
	var again answer
	if mathrand.IntN(5) == 0 {
		again = t.send(ctx, from.Owner, key, body)
	}
	t.count(func() {
		t.transfers++
		t.outcomes[outcome(first)]++
		for _, other := range []struct {
			a    answer
			kind string
			n    *int
		}{{twin, "twin", &t.twins}, {again, "resend", &t.resends}} {
			if other.a.status == 0 {
				continue
			}
			*other.n++
			if other.a.status != first.status || !bytes.Equal(other.a.body, first.body) {
				t.unequal = append(t.unequal, fmt.Sprintf("%s %s: %d %q vs %d %q", key, other.kind, other.a.status, other.a.body, first.status, first.body))
			}
		}
		// The resend came after the answer, so it must be a replay.
		if again.status != 0 && again.header.Get(phase.ReplayedHeader) != "true" {
			t.unequal = append(t.unequal, key+" resend: not marked "+phase.ReplayedHeader)
		}
	})
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

// send posts body under key until it gets a final answer (a receipt or a
// refusal), honouring Retry-After, or until it gives up: when the clients'
// time is over, or now and then after a dropped connection. A zero answer
// means it gave up.
func (t *traffic) send(ctx context.Context, owner, key string, body []byte) answer {
	backoff := 50 * time.Millisecond
	for {
		a, err := t.post(ctx, owner, key, body)
		t.count(func() {
			t.requests++
			switch {
			case err != nil:
				t.dropped++
			case a.status == http.StatusConflict:
				t.conflicts++
			case a.status >= 500:
				t.retryable++
			}
		})
		if err == nil && a.status != http.StatusConflict && a.status < 500 {
			return a
		}
		// Some clients whose connection dropped go away for good, as a
		// crashed client would; the completer finishes their transfer.
		if err != nil && mathrand.IntN(4) == 0 {
			return answer{}
		}
		wait := backoff
		if err == nil {
			if s, perr := strconv.Atoi(a.header.Get("Retry-After")); perr == nil && s > 0 {
				wait = time.Duration(s) * time.Second
			}
		}
		backoff = min(2*backoff, time.Second)
		wait = wait/2 + mathrand.N(wait)
		if time.Now().Add(wait).After(t.giveUp) {
			return answer{}
		}
		select {
		case <-ctx.Done():
			return answer{}
		case <-time.After(wait):
		}
	}
}

func (t *traffic) post(ctx context.Context, owner, key string, body []byte) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.api+"/transfers", bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+owner)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.http.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// progressLine is the demo's live line while the clients send.
func (t *traffic) progressLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Sprintf("transfers %d answered, %d abandoned | requests %d: %d 409s, %d 5xx, %d dropped",
		t.transfers, t.gaveUp, t.requests, t.conflicts, t.retryable, t.dropped)
}

func (t *traffic) count(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f()
}

// outcome names a final answer: settled, or the kind of refusal.
func outcome(a answer) string {
	if a.status == http.StatusCreated {
		var r ledger.Receipt
		if json.Unmarshal(a.body, &r) == nil && r.PayoutID != "" {
			return "settled, paid out"
		}
		return "settled internally"
	}
	var p ledger.Problem
	if json.Unmarshal(a.body, &p) == nil && p.Type != "" {
		return p.Type[strings.LastIndex(p.Type, ":")+1:]
	}
	return strconv.Itoa(a.status)
}

// outcomeOrder is the order in which write lists the usual outcomes.
var outcomeOrder = []string{"settled internally", "settled, paid out", "insufficient-funds", "currency-mismatch", "payout-failed"}

func (t *traffic) write(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var outcomes []string
	for _, name := range outcomeOrder {
		outcomes = append(outcomes, fmt.Sprintf("%d %s", t.outcomes[name], name))
	}
	for _, name := range slices.Sorted(maps.Keys(t.outcomes)) {
		if !slices.Contains(outcomeOrder, name) {
			outcomes = append(outcomes, fmt.Sprintf("%d %s", t.outcomes[name], name))
		}
	}
	fmt.Fprintf(w, "clients:  %d transfers answered: %s\n", t.transfers, strings.Join(outcomes, ", "))
	fmt.Fprintf(w, "          %d requests: %d dropped by a crash, %d answered 409 (in flight), %d answered 5xx (a retry resumes);\n",
		t.requests, t.dropped, t.conflicts, t.retryable)
	fmt.Fprintf(w, "          %d transfers sent twice at once, %d sent again after their answer, %d abandoned by their client\n",
		t.twins, t.resends, t.gaveUp)
}

// checks are what only the clients can tell: every duplicate got the first
// answer, and every transfer ended.
func (t *traffic) checks(unfinished int) []ledger.Check {
	t.mu.Lock()
	defer t.mu.Unlock()
	dup := ledger.Check{Name: "duplicates answered alike", OK: len(t.unequal) == 0,
		Detail: fmt.Sprintf("%d twins and %d resends; %d got other than the first answer", t.twins, t.resends, len(t.unequal))}
	if len(t.unequal) > 0 {
		dup.Detail += " (" + t.unequal[0] + ")"
	}
	return []ledger.Check{dup, {
		Name:   "every transfer finished",
		OK:     unfinished == 0,
		Detail: fmt.Sprintf("%d idempotency keys unfinished after the traffic stopped", unfinished),
	}}
}

// tally counts the events of the runs and of the completer: a phase.Observer.
type tally struct {
	phase.HookDefaults
	mu     sync.Mutex
	events map[keyrow.EventKind]int
}

// Observe counts ev.
func (t *tally) Observe(_ context.Context, ev keyrow.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.events == nil {
		t.events = map[keyrow.EventKind]int{}
	}
	t.events[ev.Kind] += max(ev.Count, 1)
}

func (t *tally) write(w io.Writer, provider payoutprovider.Stats) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(w, "server:   %d runs crashed, %d resumed after a crash or failure, %d replayed; %d payout outcomes unknown and repeated;\n",
		t.events[keyrow.EventCrashed], t.events[keyrow.EventResumed], t.events[keyrow.EventReplayed], t.events[keyrow.EventUnknown])
	fmt.Fprintf(w, "          %d serialization failures retried; %d keys finished by the completer\n",
		t.events[keyrow.EventRetried], t.events[keyrow.EventCompleted])
	fmt.Fprintf(w, "provider: %d payouts made (%d refused by the destination), %d answers replayed, %d faults injected\n",
		provider.Counts[payoutprovider.StatusPaid]+provider.Counts[payoutprovider.StatusFailed], provider.Counts[payoutprovider.StatusFailed], provider.Replays, provider.FaultsInjected)
}
