package conformance_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/conformance"
)

// The endpoints below are correct, and written independently of
// phase.Handler and of each other, the way other teams write them: each
// spells the contract its own way (the replay marker, the statuses, the
// error bodies, what a key may be), and none can execute a request twice.

// leaseEndpoint is written as idemlease's middleware behaves: keys are
// opaque strings of 1 to 255 characters scoped to the caller, answers are
// marked Idempotency-Replayed, errors are problem details of type
// about:blank, a key in flight answers 409 with Retry-After whatever the
// payload, a reused key 422, and a 5xx is not kept.
type leaseEndpoint struct {
	payments atomic.Int64
	mu       sync.Mutex
	keys     map[string]*leaseEntry
}

type leaseEntry struct {
	sum    [32]byte
	done   bool
	status int
	body   []byte
}

func newLeaseEndpoint() *leaseEndpoint { return &leaseEndpoint{keys: map[string]*leaseEntry{}} }

func (e *leaseEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	problem := func(status int, detail string, retry bool) {
		w.Header().Set("Content-Type", "application/problem+json")
		if retry {
			w.Header().Set("Retry-After", "1")
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail})
	}
	keys := r.Header.Values("Idempotency-Key")
	if len(keys) != 1 || len(keys[0]) < 1 || len(keys[0]) > 255 {
		problem(http.StatusBadRequest, "send exactly one Idempotency-Key of 1 to 255 characters", false)
		return
	}
	body, _ := io.ReadAll(r.Body)
	sum := sha256.Sum256([]byte(r.Method + " " + r.URL.Path + "\n" + string(body)))
	scope := r.Header.Get("Authorization") + "|" + keys[0]
	e.mu.Lock()
	entry, ok := e.keys[scope]
	if !ok {
		entry = &leaseEntry{sum: sum}
		e.keys[scope] = entry
	}
	done, status, stored, same := entry.done, entry.status, entry.body, entry.sum == sum
	e.mu.Unlock()
	switch {
	case ok && !done:
		problem(http.StatusConflict, "a request with this key is in progress", true)
		return
	case ok && !same:
		problem(http.StatusUnprocessableEntity, "the key was used with another payload", false)
		return
	case ok:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Idempotency-Replayed", "true")
		w.WriteHeader(status)
		_, _ = w.Write(stored)
		return
	}
	status, resp := e.pay(body)
	e.mu.Lock()
	if status >= 500 {
		delete(e.keys, scope)
	} else {
		entry.done, entry.status, entry.body = true, status, resp
	}
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(resp)
}

func (e *leaseEndpoint) pay(body []byte) (int, []byte) {
	time.Sleep(150 * time.Millisecond)
	if strings.Contains(string(body), "fail") {
		return http.StatusBadGateway, []byte(`{"error":"the bank did not answer"}` + "\n")
	}
	e.payments.Add(1)
	var id [8]byte
	_, _ = rand.Read(id[:])
	b, _ := json.MarshalIndent(map[string]string{"id": "pay_" + hex.EncodeToString(id[:]), "status": "paid"}, "", "  ")
	return http.StatusCreated, append(b, '\n')
}

// stripeEndpoint answers as Stripe's API does: a form body, errors as
// {"error": {...}} JSON, a reused key 400 idempotency_error, a key in
// flight 409 with Retry-After, answers marked Idempotent-Replayed, and a
// 5xx stored and replayed as the key's answer.
type stripeEndpoint struct {
	charges atomic.Int64
	mu      sync.Mutex
	keys    map[string]*stripeKey
}

type stripeKey struct {
	params string
	ready  chan struct{}
	status int
	body   string
}

func newStripeEndpoint() *stripeEndpoint { return &stripeEndpoint{keys: map[string]*stripeKey{}} }

func (e *stripeEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, typ, message string) {
		w.Header().Set("Content-Type", "application/json")
		if status == http.StatusConflict {
			w.Header().Set("Retry-After", "2")
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error": {"type": %q, "message": %q}}`, typ, message)
	}
	if err := r.ParseForm(); err != nil {
		fail(http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	key := r.Header.Get("Idempotency-Key")
	switch {
	case key == "":
		fail(http.StatusBadRequest, "invalid_request_error", "an Idempotency-Key is required")
		return
	case len(key) > 255 || len(r.Header.Values("Idempotency-Key")) > 1:
		fail(http.StatusBadRequest, "invalid_request_error", "Idempotency-Key must be one key of at most 255 characters")
		return
	}
	params := r.PostForm.Encode()
	id := r.Header.Get("Authorization") + " " + key
	e.mu.Lock()
	k, seen := e.keys[id]
	if !seen {
		k = &stripeKey{params: params, ready: make(chan struct{})}
		e.keys[id] = k
	}
	e.mu.Unlock()
	if seen {
		select {
		case <-k.ready:
		default:
			fail(http.StatusConflict, "idempotency_error", "There is currently another in-progress request using this Idempotent Key.")
			return
		}
		if k.params != params {
			fail(http.StatusBadRequest, "idempotency_error", "Keys for idempotent requests can only be used with the same parameters they were first used with.")
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(k.status)
		_, _ = io.WriteString(w, k.body)
		return
	}
	time.Sleep(150 * time.Millisecond)
	if r.PostForm.Get("fail") != "" {
		k.status, k.body = http.StatusInternalServerError, `{"error": {"type": "api_error"}}`
	} else {
		n := e.charges.Add(1)
		k.status, k.body = http.StatusOK, fmt.Sprintf(`{"id": "ch_%d", "object": "charge", "amount": %s}`, n, r.PostForm.Get("amount"))
	}
	close(k.ready)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(k.status)
	_, _ = io.WriteString(w, k.body)
}

// waitingEndpoint holds a request whose key is in flight until the first
// is answered and then answers it the same, never 409; it takes any
// non-empty key, of any length or syntax, whole, on as many lines as sent;
// its errors are plain text, and a reused key answers 409 without
// Retry-After, since retrying it cannot help.
type waitingEndpoint struct {
	orders atomic.Int64
	mu     sync.Mutex
	keys   map[string]*waitingKey
}

type waitingKey struct {
	body   string
	done   chan struct{}
	answer []byte
}

func newWaitingEndpoint() *waitingEndpoint { return &waitingEndpoint{keys: map[string]*waitingKey{}} }

func (e *waitingEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := strings.Join(r.Header.Values("Idempotency-Key"), ",")
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get("Authorization") + "\x00" + key
	e.mu.Lock()
	k, seen := e.keys[id]
	if !seen {
		k = &waitingKey{body: string(body), done: make(chan struct{})}
		e.keys[id] = k
	}
	e.mu.Unlock()
	if seen {
		<-k.done
		if k.body != string(body) {
			http.Error(w, "this key was used with another request", http.StatusConflict)
			return
		}
		if k.answer == nil {
			http.Error(w, "the first request failed; retry", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(k.answer)
		return
	}
	time.Sleep(150 * time.Millisecond)
	if strings.Contains(string(body), "fail") {
		e.mu.Lock()
		delete(e.keys, id)
		e.mu.Unlock()
		close(k.done)
		http.Error(w, "the order could not be placed", http.StatusInternalServerError)
		return
	}
	k.answer = fmt.Appendf(nil, "order %d placed\n", e.orders.Add(1))
	close(k.done)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(k.answer)
}

// peer is one of the correct endpoints, with the request it accepts.
type peer struct {
	name    string
	handler http.Handler
	count   func() int64
	header  http.Header
	body    string
	fail    string
}

func peers() []peer {
	lease, stripe, waiting := newLeaseEndpoint(), newStripeEndpoint(), newWaitingEndpoint()
	return []peer{
		{"lease", lease, lease.payments.Load, http.Header{"Content-Type": {"application/json"}}, `{"amount": 500}`, `{"amount": 500, "fail": true}`},
		{"stripe", stripe, stripe.charges.Load, http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "amount=500&currency=usd", "amount=500&currency=usd&fail=1"},
		{"waiting", waiting, waiting.orders.Load, http.Header{"Content-Type": {"application/json"}}, `{"amount": 500}`, `{"amount": 500, "fail": true}`},
	}
}

func (p peer) config(counted bool) conformance.Config {
	h := p.header.Clone()
	h.Set("Authorization", "acme")
	cfg := conformance.Config{
		Handler: p.handler, Header: h, Body: []byte(p.body), FailBody: []byte(p.fail),
		OtherCaller: http.Header{"Authorization": {"globex"}},
	}
	if counted {
		cfg.Executions = func(context.Context) (int64, error) { return p.count(), nil }
	}
	return cfg
}

// Correct endpoints written otherwise than phase.Handler pass every
// scenario of the default profile, judged from their answers alone and
// counted: none fails, none differs.
func TestCorrectEndpointsOfOtherDesignsPassTheDefaultProfile(t *testing.T) {
	t.Parallel()
	for i, p := range peers() {
		for _, counted := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/counted=%v", p.name, counted), func(t *testing.T) {
				t.Parallel()
				p := peers()[i] // an endpoint of its own, whose count is this check's
				rep, err := conformance.Check(t.Context(), p.config(counted))
				if err != nil {
					t.Fatal(err)
				}
				expectVerdicts(t, rep, nil, nil)
				if rep.Profile != "generic" || rep.Failed() {
					t.Errorf("profile %s, failed %v", rep.Profile, rep.Failed())
				}
			})
		}
	}
}

// Judged by a profile whose spelling they do not share, the same endpoints
// fail nothing: each difference is a Differs verdict that says what
// differs, and fails the check only with Strict.
func TestCorrectEndpointsOnlyDifferFromProfilesTheyDoNotFollow(t *testing.T) {
	t.Parallel()
	ps := peers()
	for _, tc := range []struct {
		peer    peer
		profile conformance.Profile
		differs map[string]string // scenario: what its Why says
	}{
		{ps[0], conformance.AtomicPhase(), map[string]string{
			"key-missing": "problem type is not urn:atomicphase:problem:missing-idempotency-key",
			"key-invalid": "was accepted (201) and its key worked; the profile refuses it with 400",
			"replay":      "a replay is marked Idempotency-Replayed; the profile's marker is Idempotent-Replayed",
			"storm":       "a replay is marked Idempotency-Replayed; the profile's marker is Idempotent-Replayed",
			"mismatch":    "problem type is not urn:atomicphase:problem:idempotency-key-reused",
		}},
		{ps[1], conformance.IETF(), map[string]string{
			"key-missing":  `the 400 is "application/json"; the profile answers application/problem+json`,
			"mismatch":     "the key reused with another body was answered 400; the profile answers 422",
			"replay":       "a replay is marked Idempotent-Replayed; the profile's marker is Idempotency-Replayed",
			"server-error": "the 500 was replayed as the key's final answer; the profile keeps no 5xx",
		}},
		{ps[2], conformance.Stripe(), map[string]string{
			"key-too-long": "was accepted (201) and its key worked; the profile refuses it with 400",
			"key-twice":    "was accepted (201) and its key worked; the profile refuses it with 400",
			"mismatch":     "the key reused with another body was answered 409; the profile answers 400",
		}},
	} {
		t.Run(tc.peer.name+"/"+tc.profile.Name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.peer.config(true)
			cfg.Profile, cfg.Strict = tc.profile, true
			rep, err := conformance.Check(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, res := range rep.Results {
				if res.Verdict == conformance.Fail {
					t.Errorf("%s failed: %s", res.Scenario, res.Why)
				}
				if want, ok := tc.differs[res.Scenario]; ok && (res.Verdict != conformance.Differs || !strings.Contains(res.Why, want)) {
					t.Errorf("%s: %s %q, want differs saying %q", res.Scenario, res.Verdict, res.Why, want)
				}
			}
			if !rep.Failed() {
				t.Error("a check with Strict that differs from its profile did not fail")
			}
			rep.Strict = false
			if rep.Failed() {
				t.Error("a check that only differs from its profile failed without Strict")
			}
		})
	}
}

// A scenario reports every failure it saw, each with its kind, and shows
// where two answers that start alike differ: a storm against a
// check-then-insert race shows the differing answers and the unmarked ones.
func TestAScenarioShowsEveryFinding(t *testing.T) {
	t.Parallel()
	m := newMem(raceCheckThenInsert)
	rep, err := conformance.Check(t.Context(), conformance.Config{
		Handler: m, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"amount": 500}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		if res.Scenario != "storm" {
			continue
		}
		var fails []string
		for _, f := range res.Findings {
			if f.Verdict == conformance.Fail {
				fails = append(fails, f.Why)
			}
		}
		if len(fails) < 2 || !strings.Contains(fails[0], `at byte `) || !strings.Contains(fails[0], `"{\"order\":`) || !strings.Contains(fails[1], "carry no replay marker, though the endpoint marks its replays") {
			t.Errorf("storm found %q", fails)
		}
	}
}

// A check whose request does not succeed, because the method is not
// allowed or nothing listens on the port, fails every scenario that needs
// it to succeed, saying so; none passes, and the in-flight scenarios do not
// take the failure for an endpoint too fast to catch.
func TestARequestThatFailsFailsTheScenariosThatNeedIt(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]conformance.Config{
		"405": {Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "use PUT", http.StatusMethodNotAllowed)
		})},
		// A refusal of the body is not a refusal of the key: the key
		// scenarios cannot pass on it.
		"a 400 to the body": {Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "the body is not a form", http.StatusBadRequest)
		})},
		// Port 1 (tcpmux) is closed here, and no test's server can take
		// it, as one could a port another server just let go.
		"closed port": {URL: "http://127.0.0.1:1/charges"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg.Body = []byte(`{"amount": 500}`)
			cfg.RequestTimeout = time.Second
			rep, err := conformance.Check(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, res := range rep.Results {
				t.Logf("%s %s: %s", res.Scenario, res.Verdict, res.Why)
				switch res.Scenario {
				case "replay", "mismatch", "in-flight", "in-flight-mismatch", "dropped-connection":
					if res.Verdict != conformance.Fail || !strings.Contains(res.Why, "the scenario needs it to succeed") {
						t.Errorf("%s: %s %q, want fail saying the request must succeed", res.Scenario, res.Verdict, res.Why)
					}
				case "key-missing", "key-empty", "key-twice", "key-too-long", "key-invalid":
					if name == "a 400 to the body" && !strings.Contains(res.Why, "but so was the same body under a valid key (answered 400)") {
						t.Errorf("%s: %s %q, want it to say the body was refused too", res.Scenario, res.Verdict, res.Why)
					}
				}
				if res.Scenario == "dropped-connection" && strings.Contains(res.Got, "answered no answer") {
					t.Errorf("dropped-connection got %q", res.Got)
				}
				if res.Verdict == conformance.Pass || strings.Contains(res.Why, "too fast") {
					t.Errorf("%s: %s %q", res.Scenario, res.Verdict, res.Why)
				}
			}
			if !rep.Failed() {
				t.Error("the check did not fail")
			}
		})
	}
}

// An input that would make every scenario fail alike, or skip the only
// scenarios that see an endpoint without a fingerprint, is an error of
// Check before the first request: an Executions count that cannot be read,
// and a Body no other request can be made from.
func TestCheckRefusesInputsThatCannotJudgeBeforeTheFirstRequest(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  conformance.Config
		want string
	}{
		"an unreadable count": {conformance.Config{Body: []byte(`{"amount": 500}`),
			Executions: func(context.Context) (int64, error) { return 0, errors.New("no such table: charges") }},
			"the Executions count cannot be read: no such table: charges"},
		"a body with nothing to change": {conformance.Config{Body: []byte(`<charge/>`), Header: http.Header{"Content-Type": {"application/xml"}}},
			"no other request to reuse a key with: cannot make another request from a body of type application/xml; pass one (-d2)"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var hits atomic.Int64
			tc.cfg.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
			rep, err := conformance.Check(t.Context(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) || rep != nil {
				t.Errorf("Check = %v, %v; want the error %q", rep, err, tc.want)
			}
			if hits.Load() != 0 {
				t.Errorf("the endpoint got %d requests", hits.Load())
			}
		})
	}
}
