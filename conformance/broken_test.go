package conformance_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/conformance"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// bug is a mistake hand-written Idempotency-Key handlers make, as the
// articles on them describe.
type bug int

const (
	// raceCheckThenInsert looks the key up and records it in two steps, so
	// that requests arriving together all find it free.
	raceCheckThenInsert bug = 1 << iota
	// noFingerprint never compares a request with the key's first one.
	noFingerprint
	// replayDiffers replays the answer re-encoded from what it stored.
	replayDiffers
	// keyOptional runs a request without a key, unprotected.
	keyOptional
	// cached500 stores a 5xx and replays it as the key's answer.
	cached500
	// noInFlight records a key only once its request is done, so that a
	// retry sent meanwhile runs again.
	noInFlight
	// noRetryAfter answers 409 without Retry-After.
	noRetryAfter
	// globalKeys keys the store by the key alone, not by its caller.
	globalKeys
	// cutKeys takes any key, cut to 255 characters.
	cutKeys
	// keyWithBody keys the store by the key and the body, so that the key
	// reused with another body runs it.
	keyWithBody
	// badKeysRun runs a request whose key it cannot read as if it had
	// none, unprotected.
	badKeysRun
)

// memHandler is an Idempotency-Key handler kept in memory, correct unless
// told to have bugs. It creates an order per execution, which takes a
// while, and fails a request whose body asks it to. With same set, every
// execution answers those bytes, as an endpoint answering
// {"status":"accepted"} does.
type memHandler struct {
	bugs       bug
	same       []byte
	executions atomic.Int64

	mu   sync.Mutex
	keys map[string]*record
}

type record struct {
	fingerprint [32]byte
	done        bool
	status      int
	body        []byte
}

func newMem(bugs bug) *memHandler { return &memHandler{bugs: bugs, keys: map[string]*record{}} }

func (m *memHandler) has(b bug) bool { return m.bugs&b != 0 }

func (m *memHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	values := r.Header.Values(keyrow.HeaderName)
	body, _ := io.ReadAll(r.Body)
	if len(values) == 0 && m.has(keyOptional) {
		status, resp := m.execute(body)
		w.WriteHeader(status)
		_, _ = w.Write(resp)
		return
	}
	if len(values) > 1 {
		phase.WriteProblem(w, http.StatusBadRequest, phase.ProblemInvalidKey, "Invalid Idempotency-Key", "one key", 0)
		return
	}
	key, err := keyrow.ParseKey(r.Header.Get(keyrow.HeaderName))
	if raw := r.Header.Get(keyrow.HeaderName); m.has(cutKeys) && raw != "" {
		key, err = raw[:min(len(raw), keyrow.MaxKeyLength)], nil
	}
	if err != nil && m.has(badKeysRun) && !errors.Is(err, keyrow.ErrKeyMissing) {
		status, resp := m.execute(body)
		w.WriteHeader(status)
		_, _ = w.Write(resp)
		return
	}
	if err != nil {
		code := phase.ProblemInvalidKey
		if errors.Is(err, keyrow.ErrKeyMissing) {
			code = phase.ProblemMissingKey
		}
		phase.WriteProblem(w, http.StatusBadRequest, code, "Invalid Idempotency-Key", err.Error(), 0)
		return
	}
	id := r.Header.Get("Authorization") + "\x00" + key
	if m.has(globalKeys) {
		id = key
	}
	fp := sha256.Sum256(body)
	if m.has(keyWithBody) {
		id += "\x00" + string(fp[:])
	}
	if m.has(noFingerprint) {
		fp = [32]byte{}
	}

	m.mu.Lock()
	rec, found := m.keys[id]
	if found {
		m.mu.Unlock()
		m.answerExisting(w, rec, fp)
		return
	}
	if m.has(raceCheckThenInsert) {
		// The lookup and the insert are two statements, as in a handler
		// that checks first and inserts after.
		m.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		m.mu.Lock()
	}
	rec = &record{fingerprint: fp}
	if !m.has(noInFlight) {
		m.keys[id] = rec
	}
	m.mu.Unlock()

	status, resp := m.execute(body)
	m.mu.Lock()
	if status >= 500 && !m.has(cached500) {
		delete(m.keys, id)
	} else {
		rec.done, rec.status, rec.body = true, status, resp
		m.keys[id] = rec
	}
	m.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(resp)
}

func (m *memHandler) answerExisting(w http.ResponseWriter, rec *record, fp [32]byte) {
	m.mu.Lock()
	done, status, body, same := rec.done, rec.status, rec.body, rec.fingerprint == fp
	m.mu.Unlock()
	switch {
	case !same:
		phase.WriteProblem(w, http.StatusUnprocessableEntity, phase.ProblemKeyReused, "Idempotency-Key reused", "another request", 0)
	case !done:
		retryAfter := time.Second
		if m.has(noRetryAfter) {
			retryAfter = 0
		}
		phase.WriteProblem(w, http.StatusConflict, phase.ProblemInProgress, "Request in progress", "retry later", retryAfter)
	default:
		if m.has(replayDiffers) {
			// Re-encoded from a decoded copy: the keys come out sorted.
			var v map[string]any
			if json.Unmarshal(body, &v) == nil {
				body, _ = json.Marshal(v)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(phase.ReplayedHeader, "true")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}
}

// execute creates an order, or fails for a body that asks to. It takes
// 200 ms, so that a retry sent 20 ms after it started (the in-flight
// scenarios) finds it still running even on a busy machine.
func (m *memHandler) execute(body []byte) (int, []byte) {
	time.Sleep(200 * time.Millisecond)
	if bytes.Contains(body, []byte(`"fail"`)) {
		return http.StatusInternalServerError, []byte(`{"error":"the order cannot be created"}`)
	}
	n := m.executions.Add(1)
	if m.same != nil {
		return http.StatusCreated, m.same
	}
	return http.StatusCreated, []byte(`{"order":` + strconv.FormatInt(n, 10) + `,"amount":500}`)
}

// Each bug is caught by the scenario named for it (and by the others that
// its mistake breaks, listed with it) under the default profile, with a
// verdict that names what was seen, and by no other scenario: a correct
// handler written independently of this library passes them all. A bug
// that is a policy rather than unsafe (a 5xx kept as final) differs from
// the profile that forbids it and fails nothing. Each handler is checked
// twice: judged from its answers alone, and with an exact count of its
// executions.
func TestBrokenHandlersAreCaughtByTheirScenario(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		bugs    bug
		profile conformance.Profile
		caught  []string
		says    string // in the first caught scenario's Why
		differs []string
	}{
		{"correct", 0, conformance.Profile{}, nil, "", nil},
		{"correct, by the atomicphase profile", 0, conformance.AtomicPhase(), nil, "", nil},
		{"check-then-insert race", raceCheckThenInsert, conformance.Profile{}, []string{"storm"}, "differ from the first, at byte", nil},
		{"no fingerprint", noFingerprint, conformance.Profile{}, []string{"mismatch"}, "got the first body's answer", nil},
		{"the body is part of the key", keyWithBody, conformance.Profile{}, []string{"mismatch", "in-flight-mismatch"}, "with an answer of its own", nil},
		{"replay that differs", replayDiffers, conformance.Profile{}, []string{"replay", "storm", "dropped-connection"}, "differs from the first answer's at byte", nil},
		{"key not required", keyOptional, conformance.Profile{}, []string{"key-missing"}, "executed without a key", nil},
		{"second execution while the first is in flight", noInFlight, conformance.Profile{}, []string{"in-flight", "in-flight-mismatch", "storm"}, "successful answer(s) for one key differ from the first", nil},
		{"409 without Retry-After", noRetryAfter, conformance.Profile{}, []string{"retry-after"}, "has no Retry-After", nil},
		{"keys shared across callers", globalKeys, conformance.Profile{}, []string{"scoping"}, "the second caller got the first request's answer, marked as a replay (Idempotent-Replayed): one caller's key answers another's", nil},
		{"unreadable keys run unprotected", badKeysRun, conformance.Profile{}, []string{"key-too-long", "key-invalid"}, "the retry's body differs from the first answer's at byte", nil},
		{"keys cut to 255 characters", cutKeys, conformance.Profile{}, []string{"key-too-long"}, "answers one key with another's", nil},
		{"cached 500s", cached500, conformance.Profile{}, nil, "", nil},
		{"cached 500s, by the atomicphase profile", cached500, conformance.AtomicPhase(), nil, "", []string{"server-error"}},
	} {
		for _, counted := range []bool{false, true} {
			name := tc.name + "/from its answers"
			if counted {
				name = tc.name + "/counted"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				m := newMem(tc.bugs)
				cfg := conformance.Config{
					Handler:     m,
					Header:      http.Header{"Authorization": {"acme"}, "Content-Type": {"application/json"}},
					Body:        []byte(`{"amount": 500}`),
					FailBody:    []byte(`{"amount": 500, "fail": true}`),
					OtherCaller: http.Header{"Authorization": {"globex"}},
					Profile:     tc.profile,
				}
				if counted {
					cfg.Executions = func(context.Context) (int64, error) { return m.executions.Load(), nil }
				}
				rep, err := conformance.Check(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				// A race is caught wherever requests overlap at the
				// handler: the in-flight scenarios' second request can
				// reach it while the first is between its lookup and
				// its insert, when the machine delays the first.
				var racy []string
				if tc.bugs&raceCheckThenInsert != 0 {
					racy = []string{"in-flight", "in-flight-mismatch"}
				}
				// A differing replay is caught in flight too when the
				// first request finishes between a retry's send and its
				// arrival: that retry is answered with the replay.
				if tc.bugs&replayDiffers != 0 {
					racy = append(racy, "in-flight")
				}
				// A missing fingerprint is caught in flight too when the
				// other body arrives after the first request finished, on
				// a machine that delayed it past the first's 200 ms: it
				// is answered with the first body's replay.
				if tc.bugs&noFingerprint != 0 {
					racy = append(racy, "in-flight-mismatch")
				}
				expectVerdicts(t, rep, tc.caught, tc.differs, racy...)
				if rep.Failed() != (len(tc.caught) > 0) {
					t.Errorf("the report failed: %v", rep.Failed())
				}
				for _, res := range rep.Results {
					if len(tc.caught) > 0 && res.Scenario == tc.caught[0] && !strings.Contains(res.Why, tc.says) {
						t.Errorf("%s says %q, want it to say %q", res.Scenario, res.Why, tc.says)
					}
					if !counted {
						continue
					}
					// A count replaces the inference, and answers it shows
					// were executions are not replays missing a marker.
					for _, f := range res.Findings {
						if strings.Contains(f.Why, "infers") || strings.Contains(f.Why, "carry no replay marker") {
							t.Errorf("%s, counted, says %q", res.Scenario, f.Why)
						}
					}
				}
			})
		}
	}
}

// Credentials in the endpoint's URL go with every request the check sends,
// the storm's included, as Go's client sends them: the correct handler
// behind a server that answers 401 without them passes every scenario.
func TestCredentialsInTheURLGoWithEveryRequest(t *testing.T) {
	t.Parallel()
	m := newMem(0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, password, ok := r.BasicAuth(); !ok || user != "acme" || password != "s3cret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		m.ServeHTTP(w, r)
	}))
	defer srv.Close()
	rep, err := conformance.Check(t.Context(), conformance.Config{
		URL:        strings.Replace(srv.URL, "http://", "http://acme:s3cret@", 1) + "/orders",
		Header:     http.Header{"Content-Type": {"application/json"}},
		Body:       []byte(`{"amount": 500}`),
		FailBody:   []byte(`{"amount": 500, "fail": true}`),
		Executions: func(context.Context) (int64, error) { return m.executions.Load(), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	expectVerdicts(t, rep, nil, nil)
}

// A correct endpoint whose every execution answers the same bytes passes
// scoping: the second caller's answer is not marked as a replay, and the
// count shows it executed; from its answers alone, an unmarked answer from
// an endpoint that marks its replays is taken for an execution of its own,
// and the report says it infers so.
func TestAnEndpointThatAnswersTheSameBytesPassesScoping(t *testing.T) {
	t.Parallel()
	for _, counted := range []bool{false, true} {
		t.Run(fmt.Sprintf("counted=%v", counted), func(t *testing.T) {
			t.Parallel()
			m := newMem(0)
			m.same = []byte(`{"status":"accepted"}`)
			cfg := conformance.Config{
				Handler:     m,
				Header:      http.Header{"Authorization": {"acme"}, "Content-Type": {"application/json"}},
				Body:        []byte(`{"amount": 500}`),
				OtherCaller: http.Header{"Authorization": {"globex"}},
			}
			says := "the kit infers an execution of its own"
			if counted {
				cfg.Executions = func(context.Context) (int64, error) { return m.executions.Load(), nil }
				says = "2 execution(s) counted"
			}
			rep, err := conformance.Check(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			expectVerdicts(t, rep, nil, nil)
			for _, res := range rep.Results {
				if res.Scenario == "scoping" && (res.Verdict != conformance.Pass || !strings.Contains(res.Got, says)) {
					t.Errorf("scoping %s, got %q, want pass saying %q", res.Verdict, res.Got, says)
				}
			}
		})
	}
}

// Without an execution count, nor a replay marker anywhere, the same bytes
// for the second caller cannot be judged from the answers: scoping is
// skipped, saying so, neither passed nor failed.
func TestTheSameBytesUnmarkedCannotBeJudgedFromTheAnswers(t *testing.T) {
	t.Parallel()
	rep, err := conformance.Check(t.Context(), conformance.Config{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(keyrow.HeaderName) == "" {
				http.Error(w, "a key, please", http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, `{"status":"accepted"}`)
		}),
		Header:      http.Header{"Authorization": {"acme"}, "Content-Type": {"application/json"}},
		Body:        []byte(`{"amount": 500}`),
		OtherCaller: http.Header{"Authorization": {"globex"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		if res.Scenario == "scoping" && (res.Verdict != conformance.Skip || !strings.Contains(res.Why, "the kit cannot tell an execution of its own from the first request's answer")) {
			t.Errorf("scoping %s: %s", res.Verdict, res.Why)
		}
	}
}

// A request that outlasts the request timeout fails the scenario that
// needs it, naming the timeout, not the request.
func TestARequestTimeoutIsNamed(t *testing.T) {
	t.Parallel()
	rep, err := conformance.Check(t.Context(), conformance.Config{
		Handler:        newMem(0),
		Header:         http.Header{"Content-Type": {"application/json"}},
		Body:           []byte(`{"amount": 500}`),
		RequestTimeout: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		if res.Scenario == "replay" && (res.Verdict != conformance.Fail || !strings.Contains(res.Why, "did not answer within the request timeout, 50ms (-request-timeout)") || strings.Contains(res.Why, "check the URL")) {
			t.Errorf("replay %s: %s", res.Verdict, res.Why)
		}
	}
}

// A check whose deadline ends in the middle of a scenario fails that
// scenario saying so, not with what its cut requests looked like, and
// skips the rest.
func TestTheCheckDeadlineIsNamed(t *testing.T) {
	t.Parallel()
	m := newMem(0)
	ctx, cancel := context.WithTimeoutCause(t.Context(), 2*time.Second, errors.New("the test's deadline passed"))
	defer cancel()
	rep, err := conformance.Check(ctx, conformance.Config{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.Header.Get(keyrow.HeaderName), "-replay-") {
				// The replay scenario outlasts the check. Once the body is
				// read, the server sees the client go.
				_, _ = io.ReadAll(r.Body)
				<-r.Context().Done()
				return
			}
			m.ServeHTTP(w, r)
		}),
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"amount": 500}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		t.Logf("%s %s: %s", res.Scenario, res.Verdict, res.Why)
		switch {
		case res.Scenario == "replay":
			if res.Verdict != conformance.Fail || res.Why != "the check was stopped during the scenario, before it could judge: the test's deadline passed" {
				t.Errorf("replay %s: %s", res.Verdict, res.Why)
			}
		case strings.HasPrefix(res.Scenario, "key-"):
		case res.Verdict != conformance.Skip || res.Why != "the check was stopped: the test's deadline passed":
			t.Errorf("%s %s: %s", res.Scenario, res.Verdict, res.Why)
		}
	}
}

// A count that never moves (-effects reading the wrong counter) fails the
// scenarios that executed, saying the count did not move, not that the
// endpoint executed 0 times where it wanted 2.
func TestACountThatNeverMovesIsNamed(t *testing.T) {
	t.Parallel()
	m := newMem(0)
	m.same = []byte(`{"status":"accepted"}`)
	rep, err := conformance.Check(t.Context(), conformance.Config{
		Handler:     m,
		Header:      http.Header{"Authorization": {"acme"}, "Content-Type": {"application/json"}},
		Body:        []byte(`{"amount": 500}`),
		OtherCaller: http.Header{"Authorization": {"globex"}},
		Executions:  func(context.Context) (int64, error) { return 0, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		if res.Scenario == "scoping" && (res.Verdict != conformance.Fail || res.Why != "the execution count did not move, though the answers show 2 execution(s): check that the count (-effects) counts this endpoint's executions") {
			t.Errorf("scoping %s: %s", res.Verdict, res.Why)
		}
	}
}
