//go:build linux

package chaos_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
)

// TestCallersUnderFaults drives three `rides serve` processes with many
// clients of package caller, each with a budget of its own, through a
// network that breaks: a proxy in front of each process drops connections
// before the request reaches it and after its answer left it, and answers
// 503 as an overloaded load balancer would; the fake Stripe fails charges
// before and after executing them; concurrent copies of a request meet
// 409s; and a random process is killed with SIGKILL and restarted every
// 200 to 500 ms. Every logical request must end with the caller holding
// the key's stored final answer, or with an UnknownOutcomeError naming its
// key; a later retry with that key must then get the final answer; and
// every ride answered 201 must have exactly one charge at Stripe, every
// other none.
func TestCallersUnderFaults(t *testing.T) {
	t.Parallel()
	callersUnderFaults(t, scenario{})
}

// TestCallersUnderFaultsAccepted is TestCallersUnderFaults with the API
// answering 202 Accepted once the ride is created and charging in the
// background: the callers follow each 202 by polling the ride's status.
func TestCallersUnderFaultsAccepted(t *testing.T) {
	t.Parallel()
	callersUnderFaults(t, scenario{accept: true})
}

func callersUnderFaults(t *testing.T, sc scenario) {
	traffic := 20 * time.Second
	if v := os.Getenv(soakEnv); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			traffic = d
		}
	}
	s := setup(t, sc)
	ctx := t.Context()
	s.setFaults(ctx, faultPlan)
	network := newFaultyNetwork(t, s.apiURLs())

	var counts chaosCounts
	chaosCtx, stopChaos := context.WithTimeout(ctx, traffic)
	defer stopChaos()
	var chaos sync.WaitGroup
	chaos.Go(func() { s.killAPIs(chaosCtx, &counts) })

	ledger := &ledger{byKey: map[string][]held{}}
	var riders sync.WaitGroup
	for i := range 12 {
		riders.Go(func() { ledger.ride(chaosCtx, t, network, i) })
	}
	// Requests whose every attempt loses its answer after the server
	// answered, and whose every attempt is lost before reaching it: both
	// end unknown, the first with the ride made, the second without.
	for _, fault := range []string{faultDropAfter, faultDropBefore} {
		riders.Go(func() { ledger.request(ctx, t, network, caller.Config{MaxAttempts: 3}, ride.UserEmail, fault, 1) })
	}
	riders.Wait()
	stopChaos()
	chaos.Wait()
	if t.Failed() {
		return
	}

	// The network and Stripe heal; every unknown outcome is retried with
	// its key, later, as its caller would.
	network.calm.Store(true)
	s.setFaults(ctx, `{"fail_before_charge_rate": 0, "timeout_after_charge_rate": 0}`)
	unknown := ledger.unknownKeys()
	for _, u := range unknown {
		ledger.retry(ctx, t, network, u)
	}
	settled, report, err := s.settle(ctx)
	if err != nil {
		t.Fatal(err)
	}

	stored := storedAnswers(t, s)
	charges := chargesByKey(t, s.stripeClient())
	var finals, replayed int
	for key, copies := range ledger.byKey {
		final, ok := "", false
		for _, h := range copies {
			switch {
			case h.unknown:
				continue
			case !ok:
				final, ok = h.answer, true
			case h.answer != final:
				t.Errorf("key %s: copies were answered %q and %q", key, final, h.answer)
			}
			if h.replayed {
				replayed++
			}
		}
		if !ok {
			t.Errorf("key %s: no caller holds an answer, even after the later retry", key)
			continue
		}
		finals++
		if stored[key] != final {
			t.Errorf("key %s: the caller holds %q; the key stores %q", key, final, stored[key])
		}
		want := 0
		if strings.HasPrefix(final, "201 ") {
			want = 1
		}
		if len(charges[key]) != want {
			t.Errorf("key %s answered %q has charges %v at Stripe, want %d", key, final, charges[key], want)
		}
		delete(charges, key)
	}
	for key, ids := range charges {
		t.Errorf("charges %v at Stripe for key %s, which no caller sent", ids, key)
	}

	c := ledger
	t.Logf("\n%d logical requests (%d keys, %d as concurrent copies), %d attempts, over %v:\n"+
		"  keys whose answer a caller holds %d (copies holding a replay %d), unknown outcomes %d, all retried later to their answer\n"+
		"  202s %d, 409s %d, 503s from the proxies %d, drops before %d, drops after the answer %d, upstream lost %d\n"+
		"  API processes killed %d; completer after traffic: %d completed, %d failed, %d dead retried\n"+
		"  charges %d for %d rides created, %d declined, %d payment failed",
		c.requests, len(ledger.byKey), c.copied, c.attempts.Load(), traffic,
		finals, replayed, len(unknown),
		c.accepted.Load(), c.conflicts.Load(), network.unavailable.Load(), network.droppedBefore.Load(), network.droppedAfter.Load(), network.upstreamLost.Load(),
		counts.kills.Load(), settled.completed, settled.failed, settled.deadRetried,
		report.Charges, report.Created, report.Declined, report.PaymentFailed)

	for _, f := range report.Failures() {
		t.Errorf("invariant violated: %s", f)
	}
	if report.UnfinishedKey != 0 || report.Charges != report.ChargedRides {
		t.Errorf("%d keys unfinished, %d charges for %d charged rides", report.UnfinishedKey, report.Charges, report.ChargedRides)
	}
	// The faults the test is about must have happened.
	type occurrence struct {
		what string
		n    int64
	}
	happened := []occurrence{
		{"unknown outcomes", int64(len(unknown))}, {"409s", c.conflicts.Load()}, {"proxy 503s", network.unavailable.Load()},
		{"drops before the request", network.droppedBefore.Load()}, {"drops after the answer", network.droppedAfter.Load()},
		{"kills", counts.kills.Load()}, {"replayed answers", int64(replayed)},
	}
	if sc.accept {
		happened = append(happened, occurrence{"202s", c.accepted.Load()})
	}
	for _, f := range happened {
		if f.n == 0 {
			t.Errorf("no %s happened: the test did not test them", f.what)
		}
	}
}

// The faults a proxy injects; a request may ask for one with faultHeader.
const (
	faultHeader     = "X-Chaos-Fault"
	faultDropBefore = "drop-before"
	faultDropAfter  = "drop-after"
	faultUnavail    = "503"
)

// faultyNetwork is a proxy in front of each API process that breaks some
// exchanges, and the transport with which callers reach a proxy picked at
// random for each attempt.
type faultyNetwork struct {
	proxies   []string
	transport *http.Transport
	// calm stops the random faults.
	calm                                                   atomic.Bool
	droppedBefore, droppedAfter, unavailable, upstreamLost atomic.Int64
}

func newFaultyNetwork(t *testing.T, apis []string) *faultyNetwork {
	n := &faultyNetwork{transport: &http.Transport{}}
	t.Cleanup(n.transport.CloseIdleConnections)
	upstream := &http.Transport{}
	t.Cleanup(upstream.CloseIdleConnections)
	for _, api := range apis {
		p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.proxy(w, r, upstream, api)
		}))
		t.Cleanup(p.Close)
		n.proxies = append(n.proxies, p.URL)
	}
	return n
}

func (n *faultyNetwork) proxy(w http.ResponseWriter, r *http.Request, upstream http.RoundTripper, api string) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		hangUp(w)
		return
	}
	fault := r.Header.Get(faultHeader)
	if fault == "" && !n.calm.Load() {
		switch x := rand.Float64(); {
		case x < 0.05:
			fault = faultDropBefore
		case x < 0.10:
			fault = faultDropAfter
		case x < 0.15:
			fault = faultUnavail
		}
	}
	switch fault {
	case faultDropBefore:
		n.droppedBefore.Add(1)
		hangUp(w)
		return
	case faultUnavail:
		n.unavailable.Add(1)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, api+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		hangUp(w)
		return
	}
	out.Header = r.Header.Clone()
	out.Header.Del(faultHeader)
	resp, err := upstream.RoundTrip(out)
	if err != nil {
		// A killed process: the caller's connection breaks as well.
		n.upstreamLost.Add(1)
		hangUp(w)
		return
	}
	answer, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		n.upstreamLost.Add(1)
		hangUp(w)
		return
	}
	if fault == faultDropAfter {
		n.droppedAfter.Add(1)
		hangUp(w)
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
	}
}

// RoundTrip sends an attempt to a proxy picked at random.
func (n *faultyNetwork) RoundTrip(req *http.Request) (*http.Response, error) {
	u, err := url.Parse(n.proxies[rand.IntN(len(n.proxies))] + req.URL.RequestURI())
	if err != nil {
		return nil, err
	}
	out := req.Clone(req.Context())
	out.URL, out.Host = u, ""
	return n.transport.RoundTrip(out)
}

// held is how one copy of a logical request ended for its caller.
type held struct {
	rider, form string
	answer      string // status and body
	replayed    bool
	unknown     bool
}

// ledger records every logical request's copies, by key.
type ledger struct {
	mu    sync.Mutex
	byKey map[string][]held

	requests, copied              int
	attempts, conflicts, accepted atomic.Int64
}

// ride sends logical requests until ctx ends: most with a patient caller
// (ten seconds), one in four with an impatient one (two attempts), and one
// in five as two or three concurrent copies under one key.
func (l *ledger) ride(ctx context.Context, t *testing.T, n *faultyNetwork, rider int) {
	for ctx.Err() == nil {
		cfg := caller.Config{MaxElapsed: 10 * time.Second, MaxAttempts: math.MaxInt32, BaseDelay: 20 * time.Millisecond, MaxDelay: 500 * time.Millisecond}
		if rand.IntN(4) == 0 {
			cfg = caller.Config{MaxAttempts: 2, BaseDelay: 20 * time.Millisecond}
		}
		email := ride.UserEmail
		if rider%4 == 3 {
			email = ride.DeclinedEmail
		}
		copies := 1
		if rand.IntN(5) == 0 {
			copies = 2 + rand.IntN(2)
		}
		// Requests outlive the traffic's end, so none is cut off.
		l.request(context.WithoutCancel(ctx), t, n, cfg, email, "", copies)
	}
}

// request sends one logical request as copies concurrent requests under
// one key, each through a caller of its own, and records how each ended.
func (l *ledger) request(ctx context.Context, t *testing.T, n *faultyNetwork, cfg caller.Config, rider, fault string, copies int) {
	cfg.Transport = n
	cfg.Observe = func(a caller.Attempt) {
		l.attempts.Add(1)
		switch a.Status {
		case http.StatusConflict:
			l.conflicts.Add(1)
		case http.StatusAccepted:
			l.accepted.Add(1)
		}
	}
	form := url.Values{}
	for _, f := range []string{"origin_lat", "origin_lon", "target_lat", "target_lon"} {
		form.Set(f, strconv.FormatFloat(rand.Float64()*80, 'f', 6, 64))
	}
	key := ""
	if copies > 1 {
		var err error
		if key, err = caller.NewKey(); err != nil {
			t.Error(err)
			return
		}
	}
	l.mu.Lock()
	l.requests++
	if copies > 1 {
		l.copied++
	}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for range copies {
		wg.Go(func() {
			c, err := caller.New(cfg)
			if err != nil {
				t.Error(err)
				return
			}
			got, h, err := send(ctx, c, rider, form.Encode(), key, fault)
			if err != nil {
				t.Errorf("a caller ended with %v; want an answer or an UnknownOutcomeError", err)
				return
			}
			if key != "" && got != key {
				t.Errorf("the caller sent key %s for a request keyed %s", got, key)
			}
			l.mu.Lock()
			l.byKey[got] = append(l.byKey[got], h)
			l.mu.Unlock()
		})
	}
	wg.Wait()
}

// send sends one request with c and returns its key and how it ended; an
// error other than an UnknownOutcomeError is returned.
func send(ctx context.Context, c *caller.Client, rider, form, key, fault string) (string, held, error) {
	h := held{rider: rider, form: form}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://rides.test/rides", strings.NewReader(form))
	if err != nil {
		return "", h, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", rider)
	if key != "" {
		req.Header.Set(caller.KeyHeader, key)
	}
	if fault != "" {
		req.Header.Set(faultHeader, fault)
	}
	res, err := c.Do(req)
	var unknown *caller.UnknownOutcomeError
	if errors.As(err, &unknown) {
		h.unknown = true
		return unknown.Key, h, nil
	}
	if err != nil {
		return "", h, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return "", h, err
	}
	h.answer, h.replayed = strconv.Itoa(res.StatusCode)+" "+string(b), res.Replayed
	return res.Key, h, nil
}

// unknownKeys returns the keys of which no copy got an answer, with the
// request each carried.
func (l *ledger) unknownKeys() []unknownKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []unknownKey
	for key, copies := range l.byKey {
		answered := false
		for _, h := range copies {
			answered = answered || !h.unknown
		}
		if !answered {
			out = append(out, unknownKey{key: key, rider: copies[0].rider, form: copies[0].form})
		}
	}
	return out
}

type unknownKey struct{ key, rider, form string }

// retry sends an unknown outcome's request again with its key through a
// patient caller and records the answer.
func (l *ledger) retry(ctx context.Context, t *testing.T, n *faultyNetwork, u unknownKey) {
	c, err := caller.New(caller.Config{Transport: n, MaxElapsed: time.Minute, MaxAttempts: math.MaxInt32})
	if err != nil {
		t.Fatal(err)
	}
	got, h, err := send(ctx, c, u.rider, u.form, u.key, "")
	if err != nil || h.unknown || got != u.key {
		t.Errorf("the later retry of %s ended with %v (unknown %v, key %s); want its final answer", u.key, err, h.unknown, got)
		return
	}
	if s := h.answer[:3]; s != "201" && s != "402" && s != "502" {
		t.Errorf("the later retry of %s was answered %q; want a final answer", u.key, h.answer)
	}
	l.mu.Lock()
	l.byKey[u.key] = append(l.byKey[u.key], h)
	l.mu.Unlock()
}

// storedAnswers returns each rides key's stored response, as status and
// body.
func storedAnswers(t *testing.T, s *system) map[string]string {
	t.Helper()
	rows, err := s.pool.Query(t.Context(), `
		SELECT idempotency_key, response_status, response_body FROM idempotency_keys
		WHERE workflow = $1 AND response_status IS NOT NULL`, ride.WorkflowName)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var (
			key    string
			status int
			body   []byte
		)
		if err := rows.Scan(&key, &status, &body); err != nil {
			t.Fatal(err)
		}
		out[key] = strconv.Itoa(status) + " " + string(body)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
