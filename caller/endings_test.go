package caller_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/caller"
)

// TestEveryEndingOfAnHTTPCallIsTheAnswerARefusalOrAnUnknownOutcomeWithTheKey
// drives the client through every way an attempt ends: a request that may
// have run never ends with a plain error, and every attempt carries the
// first one's key.
func TestEveryEndingOfAnHTTPCallIsTheAnswerARefusalOrAnUnknownOutcomeWithTheKey(t *testing.T) {
	t.Parallel()
	dropMidBody := func(replayed bool) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			if replayed {
				w.Header().Set(caller.ReplayedHeader, "true")
			}
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":`)
			http.NewResponseController(w).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}
	}
	slow := func(w http.ResponseWriter) { time.Sleep(2 * time.Second); w.WriteHeader(http.StatusCreated) }
	for _, tc := range []struct {
		name     string
		cfg      caller.Config
		ctx      func() (context.Context, context.CancelFunc)
		first    func(w http.ResponseWriter)
		then     int
		status   int   // of the answer; 0 for none
		unknown  error // the cause of the unknown outcome; nil: none
		refused  error // a plain error that proves nothing ran
		attempts int
	}{
		{name: "connection lost before any byte", first: drop, then: http.StatusCreated, status: http.StatusCreated, attempts: 2},
		{name: "store down, then back", first: status(http.StatusServiceUnavailable, "Retry-After", "0"), then: http.StatusCreated, status: http.StatusCreated, attempts: 2},
		{name: "store down throughout", cfg: caller.Config{MaxAttempts: 3}, first: status(http.StatusServiceUnavailable), then: http.StatusServiceUnavailable, unknown: caller.ErrBudgetExhausted, attempts: 3},
		{name: "in flight, then answered", first: status(http.StatusConflict, "Retry-After", "1"), then: http.StatusCreated, status: http.StatusCreated, attempts: 2},
		{name: "deadline during an attempt", first: slow, then: http.StatusCreated, unknown: context.DeadlineExceeded, attempts: 1,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 300*time.Millisecond)
			}},
		{name: "cancel during an attempt", first: slow, then: http.StatusCreated, unknown: context.Canceled, attempts: 1,
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(300*time.Millisecond, cancel)
				return ctx, cancel
			}},
		{name: "budget during an attempt", cfg: caller.Config{MaxElapsed: 300 * time.Millisecond}, first: slow, then: http.StatusCreated, unknown: caller.ErrBudgetExhausted, attempts: 1},
		{name: "a final refusal", first: status(http.StatusUnprocessableEntity), then: http.StatusCreated, status: http.StatusUnprocessableEntity, attempts: 1},
		{name: "context ended before the call", first: slow, then: http.StatusCreated, refused: context.Canceled, attempts: 0,
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := firstThen(t, tc.first, tc.then)
			c := newClient(t, tc.cfg)
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			res, err := c.Do(post(t, s.URL, `{"amount":1}`).WithContext(ctx))
			var unknown *caller.UnknownOutcomeError
			switch {
			case tc.refused != nil:
				if !errors.Is(err, tc.refused) || errors.As(err, &unknown) {
					t.Fatalf("%v; want a plain %v", err, tc.refused)
				}
			case tc.unknown == nil && err != nil:
				t.Fatalf("%v; want the answer %d", err, tc.status)
			case tc.unknown == nil:
				_ = res.Body.Close()
				if res.StatusCode != tc.status {
					t.Errorf("answer %d; want %d", res.StatusCode, tc.status)
				}
			case !errors.As(err, &unknown):
				t.Fatalf("%v (%T); want an *UnknownOutcomeError with the key", err, err)
			case !errors.Is(unknown.Cause, tc.unknown):
				t.Errorf("unknown outcome caused by %v; want %v", unknown.Cause, tc.unknown)
			}
			if n := s.attempts(); n != tc.attempts {
				t.Errorf("%d attempts reached the server; want %d", n, tc.attempts)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, k := range s.keys {
				if k == "" || k != s.keys[0] {
					t.Fatalf("keys sent %q; want one key on every attempt", s.keys)
				}
			}
			if unknown != nil && len(s.keys) > 0 && unknown.Key != s.keys[0] {
				t.Errorf("the unknown outcome names key %q; the attempts carried %q", unknown.Key, s.keys)
			}
		})
	}
	for _, replayed := range []bool{false, true} {
		t.Run("body cut short, replayed "+strconv.FormatBool(replayed), func(t *testing.T) {
			t.Parallel()
			s := firstThen(t, dropMidBody(replayed), http.StatusCreated)
			c := newClient(t, caller.Config{})
			res, err := c.Do(post(t, s.URL, `{"amount":1}`))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			_, err = io.ReadAll(res.Body)
			var unknown *caller.UnknownOutcomeError
			if !errors.As(err, &unknown) || unknown.Key != res.Key || unknown.Key == "" {
				t.Fatalf("reading a body cut short: %v; want an *UnknownOutcomeError with key %q", err, res.Key)
			}
		})
	}
}
