package conformance_test

import (
	"cmp"
	"context"
	"crypto/sha256"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/conformance"
)

// process serves an endpoint as a server process would, on a loopback
// server of its own. A restart ends it as a crash does, every connection
// closed and every execution still running abandoned at its next step, and
// serves a new process of it.
type process struct {
	srv      *httptest.Server
	start    func(alive context.Context) http.Handler
	restarts atomic.Int64

	mu   sync.Mutex
	h    http.Handler
	kill context.CancelFunc
}

func newProcess(t *testing.T, start func(alive context.Context) http.Handler) *process {
	t.Helper()
	p := &process{start: start}
	p.run()
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		h := p.h
		p.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		p.srv.Close()
		p.kill()
	})
	return p
}

// run starts a new process of the endpoint.
func (p *process) run() {
	alive, kill := context.WithCancel(context.Background())
	h := p.start(alive)
	p.mu.Lock()
	p.h, p.kill = h, kill
	p.mu.Unlock()
}

func (p *process) restart(context.Context) error {
	p.restarts.Add(1)
	p.mu.Lock()
	p.kill()
	p.mu.Unlock()
	p.srv.CloseClientConnections()
	p.run()
	return nil
}

// step waits d, and reports false when the process was killed meanwhile:
// a dead process takes no further step.
func step(alive context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return alive.Err() == nil
	case <-alive.Done():
		return false
	}
}

// bank is what outlives a process: the charges made and, for an endpoint
// that keeps its keys there, the keys.
type bank struct {
	charges atomic.Int64

	mu   sync.Mutex
	keys map[string]*bankKey
}

type bankKey struct {
	sum    [32]byte
	holder context.Context // the process that runs it
	until  time.Time       // its lease
	done   bool            // answered by its holder
	answer []byte
}

// crashEndpoint charges a card for each request: it claims the key, waits
// before, charges, writes the receipt (150 ms), then answers. With durable
// unset it keeps its keys in the process, so a restart loses them; with
// durable set it keeps them in the bank, charges and stores the answer in
// one step, and holds a key for lease: a key whose holder died answers 409
// with the lease's remaining seconds as Retry-After until the lease
// expires, then its stored answer.
type crashEndpoint struct {
	bank    *bank
	durable bool
	before  time.Duration
	lease   time.Duration
	// answerAfter is how long after its charge the endpoint answers;
	// 150 ms when zero.
	answerAfter time.Duration
}

func (e crashEndpoint) start(alive context.Context) http.Handler {
	local := &bank{keys: map[string]*bankKey{}}
	store := local
	if e.durable {
		store = e.bank
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		if key == "" || len(r.Header.Values("Idempotency-Key")) > 1 || len(key) > 255 {
			http.Error(w, "one Idempotency-Key of 1 to 255 characters, please", http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(body)
		store.mu.Lock()
		k, ok := store.keys[key]
		now := time.Now()
		switch {
		case ok && k.sum != sum:
			store.mu.Unlock()
			http.Error(w, "the key was used with another request", http.StatusUnprocessableEntity)
			return
		case ok && !k.done && now.Before(k.until):
			store.mu.Unlock()
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(k.until.Sub(now).Seconds()))))
			http.Error(w, "in progress", http.StatusConflict)
			return
		case ok && k.answer != nil:
			answer := k.answer
			store.mu.Unlock()
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(answer)
			return
		case !ok:
			k = &bankKey{sum: sum}
			store.keys[key] = k
		}
		// A new key, or one whose holder's lease expired: take it over.
		k.holder, k.until = alive, now.Add(e.lease)
		store.mu.Unlock()

		if !step(alive, e.before) {
			panic(http.ErrAbortHandler) // a dead process answers nothing
		}
		var answer []byte
		store.mu.Lock()
		if k.holder == alive {
			n := e.bank.charges.Add(1)
			answer = []byte(`{"charge": ` + strconv.FormatInt(n, 10) + `}`)
			if e.durable {
				k.answer = answer // with the charge, in one step
			}
		}
		store.mu.Unlock()
		if answer == nil || !step(alive, cmp.Or(e.answerAfter, 150*time.Millisecond)) {
			panic(http.ErrAbortHandler)
		}
		store.mu.Lock()
		k.done, k.answer = true, answer
		store.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answer)
	})
}

// checkRestart checks e behind a process with restarts, and returns the
// restart scenario's result and the process.
func checkRestart(t *testing.T, e crashEndpoint, counted bool, settle, delay time.Duration) (conformance.Result, *process) {
	t.Helper()
	e.bank = &bank{keys: map[string]*bankKey{}}
	p := newProcess(t, e.start)
	cfg := conformance.Config{
		URL:           p.srv.URL + "/charges",
		Body:          []byte(`{"amount": 500}`),
		Storm:         5,
		SettleTimeout: settle,
		Restart: func(ctx context.Context) error {
			time.Sleep(delay) // where the kill lands after an execution is seen
			return p.restart(ctx)
		},
	}
	if counted {
		cfg.Executions = func(context.Context) (int64, error) { return e.bank.charges.Load(), nil }
	}
	rep, err := conformance.Check(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		if res.Scenario == "restart" {
			t.Logf("restart: %s\nsent: %s\ngot:  %s\nwhy:  %s", res.Verdict, res.Sent, res.Got, res.Why)
			return res, p
		}
	}
	t.Fatal("no restart scenario")
	return conformance.Result{}, nil
}

// An endpoint that keeps its keys in the process charges again after a
// restart, and never passes restart however the kill lands: before its
// charge, just after it, or after its answer was sent. Each run restarts it
// at another moment; each fails, saying it executed twice, and its report
// counts every request the storm sent, those the restart cut included.
func TestRestartUnsafeEndpointNeverPassesRestart(t *testing.T) {
	t.Parallel()
	for i := range 6 {
		before := time.Duration(i) * 30 * time.Millisecond
		delay := time.Duration(i) * 40 * time.Millisecond
		t.Run("charge after "+before.String()+", kill "+delay.String()+" after it", func(t *testing.T) {
			t.Parallel()
			res, _ := checkRestart(t, crashEndpoint{before: before, lease: time.Second}, true, 0, delay)
			if res.Verdict != conformance.Fail || !strings.Contains(res.Why, "the endpoint executed 2 time(s)") {
				t.Errorf("restart %s: %s, want fail for a second execution", res.Verdict, res.Why)
			}
			if total := tallied(t, res.Got); total != 5 {
				t.Errorf("the report counts %d of the storm's 5 requests: %s", total, res.Got)
			}
		})
	}
}

// tallied adds up the counts of a storm's tally, "1× 201, 3× 409, 1× no
// answer", the first part of got.
func tallied(t *testing.T, got string) int {
	t.Helper()
	tally, _, _ := strings.Cut(got, "; ")
	total := 0
	for _, m := range regexp.MustCompile(`(\d+)× `).FindAllStringSubmatch(tally, -1) {
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	return total
}

// An endpoint that keeps its keys and answers durably passes restart,
// though its key answers 409 for longer than SettleTimeout after the
// restart: the check waits as the endpoint's Retry-After says. Without an
// execution count it cannot pass: the scenario says why it did not judge.
func TestRestartSafeEndpointPassesWaitingAsRetryAfterSays(t *testing.T) {
	t.Parallel()
	// The answer comes 2 s after the charge, so that the restart, sent
	// once the check has seen the charge counted, lands before it on a
	// busy machine too: a restart after the answer leaves nothing to wait
	// for.
	e := crashEndpoint{durable: true, before: 50 * time.Millisecond, lease: 3 * time.Second, answerAfter: 2 * time.Second}
	t.Run("counted", func(t *testing.T) {
		t.Parallel()
		res, p := checkRestart(t, e, true, 500*time.Millisecond, 0)
		if res.Verdict != conformance.Pass || p.restarts.Load() != 1 {
			t.Errorf("restart %s after %d restarts: %s", res.Verdict, p.restarts.Load(), res.Why)
		}
		if !strings.Contains(res.Got, "Idempotent-Replayed") || !strings.Contains(res.Sent, "tries over") {
			t.Errorf("the retry after the restart did not wait for the replay: %s", res.Got)
		}
	})
	t.Run("from its answers", func(t *testing.T) {
		t.Parallel()
		res, _ := checkRestart(t, e, false, 500*time.Millisecond, 0)
		if res.Verdict != conformance.Skip || !strings.Contains(res.Why, "cannot tell an execution resumed after the restart from a second one") {
			t.Errorf("restart %s: %s, want a skip saying why", res.Verdict, res.Why)
		}
		// It says what it saw, a request refused while the key was held,
		// and that the restart cut connections; not an execution in flight.
		if !strings.Contains(res.Sent, "once a request was answered 409") || !strings.Contains(res.Sent, "the server went away") || strings.Contains(res.Sent, "with an execution in flight") {
			t.Errorf("restart sent %q", res.Sent)
		}
	})
}

// When no execution can be seen in flight, because the endpoint holds a
// request whose key is in flight and answers it only once the first is
// answered, the restart is never run: the scenario tries again under new
// keys, then says it was not exercised.
func TestRestartNotExercisedIsNotAPass(t *testing.T) {
	t.Parallel()
	var restarts atomic.Int64
	rep, err := conformance.Check(t.Context(), conformance.Config{
		Handler: newWaitingEndpoint(),
		Body:    []byte(`{"amount": 500}`),
		Storm:   5,
		Restart: func(context.Context) error {
			restarts.Add(1)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		if res.Scenario == "restart" && (res.Verdict != conformance.Skip || !strings.Contains(res.Why, "not exercised: in 5 storms") || restarts.Load() != 0) {
			t.Errorf("restart %s after %d restarts: %s", res.Verdict, restarts.Load(), res.Why)
		}
	}
}

// restartResult checks the endpoint p serves, counted by executions and
// restarted by restart, and returns the restart scenario's result.
func restartResult(t *testing.T, p *process, executions func() int64, restart func(context.Context) error) conformance.Result {
	t.Helper()
	rep, err := conformance.Check(t.Context(), conformance.Config{
		URL:        p.srv.URL + "/charges",
		Body:       []byte(`{"amount": 500}`),
		Storm:      5,
		Executions: func(context.Context) (int64, error) { return executions(), nil },
		Restart:    restart,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		if res.Scenario == "restart" {
			t.Logf("restart: %s\nsent: %s\ngot:  %s\nwhy:  %s", res.Verdict, res.Sent, res.Got, res.Why)
			return res
		}
	}
	t.Fatal("no restart scenario")
	return conformance.Result{}
}

// A restart command that restarts nothing (true) does not exercise the
// restart scenario, however safe the storm looked: an endpoint that keeps
// its keys in memory is skipped as not exercised, once, never passed; its
// report does not claim a restart it did not see.
func TestARestartThatRestartsNothingIsNotExercised(t *testing.T) {
	t.Parallel()
	e := crashEndpoint{bank: &bank{keys: map[string]*bankKey{}}, before: 50 * time.Millisecond, lease: time.Second}
	var calls atomic.Int64
	res := restartResult(t, newProcess(t, e.start), e.bank.charges.Load, func(context.Context) error {
		calls.Add(1)
		return nil
	})
	if res.Verdict != conformance.Skip || !strings.Contains(res.Why, "not exercised: the restart command returned, but nothing shows the server went away") || calls.Load() != 1 {
		t.Errorf("restart %s after %d restarts: %s", res.Verdict, calls.Load(), res.Why)
	}
	if strings.Contains(res.Sent, "the server went away") {
		t.Errorf("the report claims a restart: %s", res.Sent)
	}
}

// An execution count kept in the process, which a restart resets, goes
// down across it: the restart scenario fails saying so, not that the
// endpoint executed a negative number of times.
func TestACountThatGoesDownAcrossARestartIsNamed(t *testing.T) {
	t.Parallel()
	e := crashEndpoint{bank: &bank{keys: map[string]*bankKey{}}, before: 50 * time.Millisecond, lease: time.Second}
	p := newProcess(t, e.start)
	var base atomic.Int64 // the charges made by earlier processes
	res := restartResult(t, p, func() int64 { return e.bank.charges.Load() - base.Load() }, func(ctx context.Context) error {
		base.Store(e.bank.charges.Load())
		return p.restart(ctx)
	})
	if res.Verdict != conformance.Fail || !strings.Contains(res.Why, "the execution count went down from") || strings.Contains(res.Why, "executed -") {
		t.Errorf("restart %s: %s", res.Verdict, res.Why)
	}
}
