package caller_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// server is an endpoint whose answer to each attempt a test scripts. It
// records every attempt's key and body.
type server struct {
	*httptest.Server
	mu       sync.Mutex
	keys     []string
	bodies   []string
	methods  []string
	times    []time.Time
	answer   func(n int, w http.ResponseWriter, r *http.Request) // n counts from 1
	effects  map[string]int                                      // work done per key
	finished map[string]bool
}

func newServer(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *server {
	t.Helper()
	s := &server{answer: answer, effects: map[string]int{}, finished: map[string]bool{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.keys = append(s.keys, r.Header.Get(caller.KeyHeader))
		s.bodies = append(s.bodies, string(body))
		s.methods = append(s.methods, r.Method)
		s.times = append(s.times, time.Now())
		n := len(s.keys)
		s.mu.Unlock()
		s.answer(n, w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

func (s *server) effectsOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[key]
}

// work does the request's effect once per key and answers 201, or replays
// the answer when the key has finished, as an idempotent endpoint does.
func (s *server) work(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(caller.KeyHeader)
	s.mu.Lock()
	done := s.finished[key]
	if !done {
		s.effects[key]++
		s.finished[key] = true
	}
	s.mu.Unlock()
	if done {
		w.Header().Set(caller.ReplayedHeader, "true")
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"id":1}`)
}

// drop closes the connection without an answer, as a crashed server or a
// broken network does.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	_ = conn.Close()
}

// newClient returns a caller on a transport of the test's own, whose idle
// connections are closed when the test ends, so that goleak sees none.
func newClient(t *testing.T, cfg caller.Config) *caller.Client {
	t.Helper()
	if cfg.Transport == nil {
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		cfg.Transport = tr
	}
	if cfg.BaseDelay == 0 {
		cfg.BaseDelay = time.Millisecond
	}
	if cfg.MaxDelay == 0 {
		cfg.MaxDelay = 10 * time.Millisecond
	}
	c, err := caller.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func post(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

// firstThen returns a server that answers the first attempt with first
// and every later one with the status then.
func firstThen(t *testing.T, first func(w http.ResponseWriter), then int) *server {
	t.Helper()
	return newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			first(w)
			return
		}
		w.WriteHeader(then)
	})
}

// status returns a first answer of code, with headers.
func status(code int, header ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
	}
}

// do sends req with c and returns the answer and its body; an error fails
// t.
func do(t *testing.T, c *caller.Client, req *http.Request) (*caller.Response, string) {
	t.Helper()
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res, read(t, res)
}

// read returns the body of res and closes it.
func read(t *testing.T, res *caller.Response) string {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sameKeyAndBody fails t unless every attempt carried one non-empty key and
// the request's body.
func (s *server) sameKeyAndBody(t *testing.T, body string) string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.keys {
		if s.keys[i] == "" || s.keys[i] != s.keys[0] {
			t.Errorf("attempt %d carried key %q; attempt 1 carried %q", i+1, s.keys[i], s.keys[0])
		}
		if s.bodies[i] != body {
			t.Errorf("attempt %d carried body %q, want %q", i+1, s.bodies[i], body)
		}
	}
	return s.keys[0]
}

func TestConnectionDroppedBeforeTheAnswerIsRetriedUnderTheSameKey(t *testing.T) {
	t.Parallel()
	s := firstThen(t, drop, http.StatusCreated)
	res, _ := do(t, newClient(t, caller.Config{}), post(t, s.URL, `{"amount":5}`))
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("answer %d, want 201", res.StatusCode)
	}
	if res.Attempts != 2 || s.attempts() != 2 || res.Replayed {
		t.Fatalf("Attempts %d, server saw %d, Replayed %v; want 2, 2, false", res.Attempts, s.attempts(), res.Replayed)
	}
	if key := s.sameKeyAndBody(t, `{"amount":5}`); key != res.Key {
		t.Fatalf("Response.Key %q, the server saw %q", res.Key, key)
	}
}

// The server did the work and the connection broke before the answer
// arrived: the retry gets the stored answer, and the work was done once.
func TestConnectionDroppedAfterTheWorkGetsTheReplay(t *testing.T) {
	t.Parallel()
	var s *server
	s = newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			s.work(httptest.NewRecorder(), r) // the answer is lost
			drop(w)
			return
		}
		s.work(w, r)
	})
	res, _ := do(t, newClient(t, caller.Config{}), post(t, s.URL, `{"amount":5}`))
	if res.StatusCode != http.StatusCreated || !res.Replayed || res.Attempts != 2 {
		t.Fatalf("answer %d, Replayed %v, Attempts %d; want 201, true, 2", res.StatusCode, res.Replayed, res.Attempts)
	}
	if n := s.effectsOf(res.Key); n != 1 {
		t.Fatalf("the work was done %d times, want once", n)
	}
	s.sameKeyAndBody(t, `{"amount":5}`)
}

// A connection that breaks in the middle of the answer's headers is an
// attempt with no answer: retried.
func TestAnswerCutOffMidHeadersIsRetried(t *testing.T) {
	t.Parallel()
	s := firstThen(t, func(w http.ResponseWriter) {
		conn, buf, _ := http.NewResponseController(w).Hijack()
		_, _ = buf.WriteString("HTTP/1.1 201 Created\r\nContent-Le")
		_ = buf.Flush()
		_ = conn.Close()
	}, http.StatusCreated)
	res, _ := do(t, newClient(t, caller.Config{}), post(t, s.URL, "x"))
	if res.StatusCode != http.StatusCreated || res.Attempts != 2 {
		t.Fatalf("answer %d after %d attempts, want 201 after 2", res.StatusCode, res.Attempts)
	}
}

func TestConflictThenSuccess(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n <= 2 {
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	res, _ := do(t, newClient(t, caller.Config{}), post(t, s.URL, "x"))
	if res.StatusCode != http.StatusOK || res.Attempts != 3 {
		t.Fatalf("answer %d after %d attempts, want 200 after 3", res.StatusCode, res.Attempts)
	}
	s.sameKeyAndBody(t, "x")
}

func TestRetryAfterIsHonouredInSecondsAndAsADate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		value  func() string
	}{
		{"503 seconds", http.StatusServiceUnavailable, func() string { return "1" }},
		// An HTTP-date has whole seconds: two seconds ahead is at least one.
		{"429 date", http.StatusTooManyRequests, func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := firstThen(t, func(w http.ResponseWriter) { status(tc.status, "Retry-After", tc.value())(w) }, http.StatusOK)
			res, _ := do(t, newClient(t, caller.Config{}), post(t, s.URL, "x"))
			if res.StatusCode != http.StatusOK || res.Attempts != 2 {
				t.Fatalf("answer %d after %d attempts, want 200 after 2", res.StatusCode, res.Attempts)
			}
			s.mu.Lock()
			pause := s.times[1].Sub(s.times[0])
			s.mu.Unlock()
			if pause < 900*time.Millisecond {
				t.Fatalf("the retry came %v after the %d; Retry-After asked for a second", pause, tc.status)
			}
		})
	}
}

func TestRetriedStatuses(t *testing.T) {
	t.Parallel()
	for _, code := range []int{408, 409, 425, 429, 500, 502, 503, 504} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Parallel()
			s := firstThen(t, status(code), http.StatusCreated)
			res, _ := do(t, newClient(t, caller.Config{}), post(t, s.URL, "x"))
			if res.StatusCode != http.StatusCreated || res.Attempts != 2 {
				t.Fatalf("%d: answer %d after %d attempts, want 201 after 2", code, res.StatusCode, res.Attempts)
			}
		})
	}
}

func TestFinalStatusesAreNotRetried(t *testing.T) {
	t.Parallel()
	for _, code := range []int{200, 201, 202, 400, 401, 402, 403, 404, 405, 413, 415, 422, 501, 505} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Parallel()
			s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(code)
				_, _ = io.WriteString(w, "answer")
			})
			res, got := do(t, newClient(t, caller.Config{}), post(t, s.URL, "x"))
			if res.StatusCode != code || got != "answer" {
				t.Fatalf("answer %d %q, want %d answer", res.StatusCode, got, code)
			}
			if res.Attempts != 1 || s.attempts() != 1 {
				t.Fatalf("%d: %d attempts, server saw %d; want 1", code, res.Attempts, s.attempts())
			}
		})
	}
}

// A replayed answer is the key's stored one: retrying it would get it
// again, whatever its status.
func TestReplayedAnswerIsReturnedWhateverItsStatus(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n > 1 {
			w.Header().Set(caller.ReplayedHeader, "true")
		}
		w.WriteHeader(http.StatusBadGateway)
	})
	res, _ := do(t, newClient(t, caller.Config{}), post(t, s.URL, "x"))
	if res.StatusCode != http.StatusBadGateway || !res.Replayed || res.Attempts != 2 {
		t.Fatalf("answer %d, Replayed %v, Attempts %d; want 502, true, 2", res.StatusCode, res.Replayed, res.Attempts)
	}
}

func TestStripeShouldRetryOverridesTheStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status   int
		header   string
		attempts int
	}{
		{http.StatusUnprocessableEntity, "true", 2},
		{http.StatusInternalServerError, "false", 1},
		{http.StatusServiceUnavailable, "false", 1},
		{http.StatusConflict, "false", 1},
	} {
		s := firstThen(t, status(tc.status, caller.ShouldRetryHeader, tc.header), http.StatusOK)
		res, _ := do(t, newClient(t, caller.Config{}), post(t, s.URL, "x"))
		if res.Attempts != tc.attempts {
			t.Errorf("%d with %s: %s: %d attempts, want %d", tc.status, caller.ShouldRetryHeader, tc.header, res.Attempts, tc.attempts)
		}
	}
}

// When the budget runs out the caller gets the key, and a later request
// with that key completes the work once.
func TestBudgetExhaustedNamesTheKeyAndALaterRetryCompletes(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		down = true
		s    *server
	)
	s = newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		d := down
		mu.Unlock()
		if d {
			s.work(httptest.NewRecorder(), r) // the work is done; the answer is lost
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		s.work(w, r)
	})
	c := newClient(t, caller.Config{MaxAttempts: 3})
	_, err := c.Do(post(t, s.URL, "x"))
	var unknown *caller.UnknownOutcomeError
	if !errors.As(err, &unknown) || !errors.Is(err, caller.ErrBudgetExhausted) {
		t.Fatalf("Do returned %v, want an UnknownOutcomeError for the exhausted budget", err)
	}
	key := s.sameKeyAndBody(t, "x")
	if unknown.Key != key || unknown.Attempts != 3 || unknown.Status != http.StatusServiceUnavailable {
		t.Fatalf("error %+v; want key %q, 3 attempts, last status 503", unknown, key)
	}
	if !strings.Contains(err.Error(), key) {
		t.Fatalf("the error %q does not name the key", err)
	}

	mu.Lock()
	down = false
	mu.Unlock()
	req := post(t, s.URL, "x")
	req.Header.Set(caller.KeyHeader, unknown.Key)
	res, _ := do(t, c, req)
	if res.StatusCode != http.StatusCreated || !res.Replayed || res.Key != key {
		t.Fatalf("the later retry got %d, Replayed %v, key %q; want 201, true, %q", res.StatusCode, res.Replayed, res.Key, key)
	}
	if n := s.effectsOf(key); n != 1 {
		t.Fatalf("the work was done %d times, want once", n)
	}
}

// A Retry-After beyond the elapsed budget ends the request at once rather
// than sleeping past it, whether it comes with a retried status or with a
// 202 whose status would be polled.
func TestRetryAfterBeyondTheBudgetEndsAtOnce(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusAccepted} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Parallel()
			s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "/status/1")
				w.Header().Set("Retry-After", "30")
				w.WriteHeader(code)
			})
			start := time.Now()
			_, err := newClient(t, caller.Config{MaxElapsed: 2 * time.Second}).Do(post(t, s.URL, "x"))
			var unknown *caller.UnknownOutcomeError
			if !errors.As(err, &unknown) || !errors.Is(err, caller.ErrBudgetExhausted) || unknown.Status != code {
				t.Fatalf("Do returned %v, want an unknown outcome for the exhausted budget after the %d", err, code)
			}
			if took := time.Since(start); took > time.Second {
				t.Fatalf("Do took %v; it should give up at once", took)
			}
			if s.attempts() != 1 {
				t.Fatalf("server saw %d attempts, want 1", s.attempts())
			}
		})
	}
}

// The elapsed budget covers an attempt in flight: a server that never
// answers ends in an unknown outcome after MaxElapsed.
func TestHungServerEndsAfterMaxElapsed(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	start := time.Now()
	_, err := newClient(t, caller.Config{MaxElapsed: 200 * time.Millisecond}).Do(post(t, s.URL, "x"))
	var unknown *caller.UnknownOutcomeError
	if !errors.As(err, &unknown) || !errors.Is(err, caller.ErrBudgetExhausted) {
		t.Fatalf("Do returned %v, want an unknown outcome for the exhausted budget", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Do took %v with a 200ms budget", took)
	}
}

func TestCallerCancellationIsAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusConflict)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req := post(t, s.URL, "x").WithContext(ctx)
	_, err := newClient(t, caller.Config{BaseDelay: 20 * time.Millisecond, MaxDelay: 20 * time.Millisecond, MaxAttempts: 1000}).Do(req)
	var unknown *caller.UnknownOutcomeError
	if !errors.As(err, &unknown) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, caller.ErrBudgetExhausted) {
		t.Fatalf("Do returned %v, want an unknown outcome caused by the caller's deadline", err)
	}
	if unknown.Key == "" || unknown.Attempts < 2 {
		t.Fatalf("error %+v: want the key and several attempts", unknown)
	}
}

func TestCallerSuppliedKeyIsKept(t *testing.T) {
	t.Parallel()
	s := firstThen(t, drop, http.StatusOK)
	req := post(t, s.URL, "x")
	req.Header.Set(caller.KeyHeader, `"order-42"`)
	res, _ := do(t, newClient(t, caller.Config{}), req)
	if key := s.sameKeyAndBody(t, "x"); key != `"order-42"` || res.Key != key {
		t.Fatalf("the server saw key %s, Response.Key %s; want the caller's \"order-42\"", key, res.Key)
	}
	if req.Header.Get(caller.KeyHeader) != `"order-42"` || len(req.Header.Values(caller.KeyHeader)) != 1 {
		t.Fatalf("Do changed the caller's request headers: %v", req.Header)
	}
}

func TestNewKeysAreUUIDv7AndDistinct(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		k, err := caller.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		if len(k) != 36 || k[14] != '7' || seen[k] {
			t.Fatalf("key %q: want a new UUIDv7", k)
		}
		seen[k] = true
	}
}

// A body without GetBody is buffered and re-sent whole; one over the limit
// fails before anything is sent.
func TestBodyWithoutGetBody(t *testing.T) {
	t.Parallel()
	s := firstThen(t, drop, http.StatusOK)
	c := newClient(t, caller.Config{MaxBodyBytes: 10})
	req := post(t, s.URL, "")
	req.Body, req.GetBody = io.NopCloser(strings.NewReader("0123456789")), nil
	do(t, c, req)
	s.sameKeyAndBody(t, "0123456789")

	req = post(t, s.URL, "")
	req.Body, req.GetBody = io.NopCloser(strings.NewReader("0123456789A")), nil
	if _, err := c.Do(req); err == nil || errors.As(err, new(*caller.UnknownOutcomeError)) {
		t.Fatalf("Do of an 11-byte body with a 10-byte limit returned %v, want a plain error", err)
	}
	if s.attempts() != 2 {
		t.Fatalf("the oversized body was sent: the server saw %d attempts, want 2", s.attempts())
	}
}

func TestSafeMethodsPassThroughWithoutAKey(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	c := newClient(t, caller.Config{})
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodOptions} {
		req, _ := http.NewRequest(m, s.URL, nil)
		res, _ := do(t, c, req)
		if res.StatusCode != http.StatusServiceUnavailable || res.Attempts != 1 || res.Key != "" {
			t.Fatalf("%s: answer %d after %d attempts with key %q; want the 503, once, without a key", m, res.StatusCode, res.Attempts, res.Key)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range s.keys {
		if k != "" {
			t.Fatalf("%s carried Idempotency-Key %q", s.methods[i], k)
		}
	}
	if len(s.keys) != 3 {
		t.Fatalf("the server saw %d requests, want 3", len(s.keys))
	}
}

// An http.Client on the caller retries the same way.
func TestHTTPClientOnTheCallerRetries(t *testing.T) {
	t.Parallel()
	s := firstThen(t, drop, http.StatusCreated)
	hc := &http.Client{Transport: newClient(t, caller.Config{})}
	res, err := hc.Post(s.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("answer %d, want 201", res.StatusCode)
	}
	s.sameKeyAndBody(t, "{}")
}

func TestObserveSeesEveryAttempt(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			drop(w)
		case 2:
			w.WriteHeader(http.StatusConflict)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})
	var seen []caller.Attempt
	res, _ := do(t, newClient(t, caller.Config{Observe: func(a caller.Attempt) { seen = append(seen, a) }}), post(t, s.URL, "x"))
	if len(seen) != 3 || seen[0].Err == nil || !seen[0].Retry || seen[1].Status != 409 || !seen[1].Retry ||
		seen[2].Status != 201 || seen[2].Retry || seen[2].Number != 3 || seen[2].Key != res.Key {
		t.Fatalf("observed %+v", seen)
	}
}

func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	for _, cfg := range []caller.Config{{MaxAttempts: -1}, {MaxElapsed: -2}, {BaseDelay: -1}, {MaxBodyBytes: -1}} {
		if _, err := caller.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted it", cfg)
		}
	}
}

// A 202 with a Location is followed: the status is polled with GET, under
// the key, until it stops answering 202.
func TestAcceptedIsFollowedByPollingItsLocation(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch {
		case n == 1:
			w.Header().Set("Location", "/status/1")
			w.WriteHeader(http.StatusAccepted)
		case n <= 3:
			w.WriteHeader(http.StatusAccepted)
		default:
			w.Header().Set(caller.ReplayedHeader, "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "done")
		}
	})
	res, body := do(t, newClient(t, caller.Config{MaxAttempts: 2}), post(t, s.URL+"/orders", "x"))
	if res.StatusCode != http.StatusCreated || body != "done" || !res.Replayed || res.Attempts != 4 {
		t.Fatalf("answer %d %q, Replayed %v, Attempts %d; want the replayed 201 after 4 attempts", res.StatusCode, body, res.Replayed, res.Attempts)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 1; i < 4; i++ {
		if s.methods[i] != http.MethodGet || s.keys[i] != s.keys[0] || s.bodies[i] != "" {
			t.Fatalf("poll %d: %s with key %q and body %q; want GET with the key, no body", i, s.methods[i], s.keys[i], s.bodies[i])
		}
	}
}

// A 202 with Retry-After is polled no sooner than it asks: each poll comes
// at least the Retry-After after the answer before it, and the caller
// waits for it rather than for its own, shorter backoff.
func TestAcceptedIsPolledAfterItsRetryAfter(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			w.Header().Set("Location", "/status/1")
			fallthrough
		case 2:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusAccepted)
		default:
			w.Header().Set(caller.ReplayedHeader, "true")
			w.WriteHeader(http.StatusCreated)
		}
	})
	var waits []time.Duration
	c := newClient(t, caller.Config{Observe: func(a caller.Attempt) {
		if a.Retry {
			waits = append(waits, a.Wait)
		}
	}})
	res, _ := do(t, c, post(t, s.URL+"/orders", "x"))
	if res.StatusCode != http.StatusCreated || res.Attempts != 3 || s.attempts() != 3 {
		t.Fatalf("answer %d after %d attempts (server saw %d); want 201 after the request and two polls",
			res.StatusCode, res.Attempts, s.attempts())
	}
	if len(waits) != 2 || waits[0] < time.Second || waits[1] < time.Second {
		t.Fatalf("the caller waited %v before its polls; each 202 asked for a second", waits)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 1; i < len(s.times); i++ {
		if gap := s.times[i].Sub(s.times[i-1]); gap < time.Second {
			t.Fatalf("poll %d came %v after the 202 before it, which asked for Retry-After: 1", i, gap)
		}
	}
}
