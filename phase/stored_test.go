package phase_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

type signup struct {
	Email string `json:"email"`
}

// answering is a one-phase workflow that answers every request with
// respond's response, and counts its runs.
type answering struct {
	db   *pgxpool.Pool
	w    *phase.Workflow[signup, struct{}]
	c    *phase.Client
	runs atomic.Int32
}

func setupAnswering(t *testing.T, name string, store *phase.StoreConfig, respond func() phase.Result) *answering {
	t.Helper()
	return newAnswering(t, pgtest.Pool(t), name, store, respond)
}

func newAnswering(t *testing.T, db *pgxpool.Pool, name string, store *phase.StoreConfig, respond func() phase.Result) *answering {
	t.Helper()
	a := &answering{db: db}
	w, err := phase.NewWorkflow(name, phase.Local("answered",
		func(ctx context.Context, tx pgx.Tx, in *phase.Input[signup, struct{}]) (phase.Result, error) {
			a.runs.Add(1)
			return respond(), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	if store != nil {
		if err := w.StoreResponses(*store); err != nil {
			t.Fatal(err)
		}
	}
	a.w = w
	if a.c, err = phase.NewClient(a.db, &phase.Config{Logger: quiet}, w); err != nil {
		t.Fatal(err)
	}
	return a
}

// handler serves the workflow behind a middleware that gives every request
// its own X-Request-Id, as request-id middleware does.
func (a *answering) handler(t *testing.T, mutate ...func(*phase.HTTPConfig[signup])) http.Handler {
	t.Helper()
	cfg := phase.HTTPConfig[signup]{Tenant: func(r *http.Request) (string, error) { return "acme", nil }}
	for _, m := range mutate {
		m(&cfg)
	}
	h, err := phase.Handler(a.c, a.w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("X-Request-Id", fmt.Sprintf("req-%d", n.Add(1)))
		h.ServeHTTP(rw, r)
	})
}

func postSignup(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/signup", strings.NewReader(`{"email":"a@example.com"}`))
	r.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// loggedIn answers as a login would: a session cookie for the caller,
// per-caller headers, and headers that describe the resource.
func loggedIn() phase.Result {
	return phase.Respond(http.StatusCreated, http.Header{
		"Content-Type":          {"application/json"},
		"Location":              {"/users/1"},
		"Set-Cookie":            {"session=first-callers-secret; HttpOnly"},
		"X-Request-Id":          {"id-of-the-first-run"},
		"X-Ratelimit-Remaining": {"9"},
	}, []byte(`{"user":1}`))
}

func TestReplayCarriesNoCookieOfTheFirstCaller(t *testing.T) {
	t.Parallel()
	a := setupAnswering(t, "signup", nil, loggedIn)
	h := a.handler(t)

	first := postSignup(h, "k1")
	if first.Code != http.StatusCreated || first.Header().Get("Set-Cookie") == "" {
		t.Fatalf("first caller: %d, Set-Cookie %q; want 201 with its own cookie", first.Code, first.Header().Get("Set-Cookie"))
	}
	second := postSignup(h, "k1")
	if second.Header().Get(phase.ReplayedHeader) != "true" || a.runs.Load() != 1 {
		t.Fatalf("second caller was not a replay (runs %d)", a.runs.Load())
	}
	if c := second.Header().Values("Set-Cookie"); len(c) > 0 {
		t.Fatalf("the replay handed the first caller's cookie to the second: %q", c)
	}
	if got := second.Header().Get("Location"); got != "/users/1" {
		t.Errorf("replayed Location = %q, want /users/1", got)
	}
	if got := second.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("replayed Content-Type = %q, want application/json", got)
	}
	if second.Body.String() != first.Body.String() || second.Code != first.Code {
		t.Errorf("replay %d %q differs from the first answer %d %q", second.Code, second.Body, first.Code, first.Body)
	}

	var stored []byte
	if err := a.db.QueryRow(context.Background(), `SELECT response_headers::text FROM idempotency_keys`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"Set-Cookie", "X-Request-Id", "X-Ratelimit-Remaining"} {
		if bytes.Contains(stored, []byte(h)) {
			t.Errorf("the key row stores %s: %s", h, stored)
		}
	}
}

func TestReplayKeepsTheHeadersMiddlewareSetForTheCurrentRequest(t *testing.T) {
	t.Parallel()
	// Even a workflow that asks to replay X-Request-Id does not override
	// the one the current request's middleware set.
	a := setupAnswering(t, "signup", &phase.StoreConfig{ReplayHeaders: []string{"X-Request-Id"}}, loggedIn)
	h := a.handler(t)

	postSignup(h, "k1")
	second := postSignup(h, "k1")
	if got := second.Header().Values("X-Request-Id"); len(got) != 1 || got[0] != "req-2" {
		t.Errorf("replayed X-Request-Id = %q, want the current request's [req-2]", got)
	}
	if got := second.Header().Get("X-Ratelimit-Remaining"); got != "" {
		t.Errorf("the replay carries the first caller's rate limit %q", got)
	}
}

func TestCookieStoredByAnEarlierReleaseIsNotReplayed(t *testing.T) {
	t.Parallel()
	a := setupAnswering(t, "signup", nil, loggedIn)
	h := a.handler(t)
	postSignup(h, "k1")
	// A release before the header policy stored every header.
	if _, err := a.db.Exec(context.Background(), `UPDATE idempotency_keys SET response_headers =
		'{"Set-Cookie":["session=first-callers-secret"],"Authorization":["Bearer x"],"X-Request-Id":["req-1"],"Content-Type":["application/json"]}'`); err != nil {
		t.Fatal(err)
	}
	second := postSignup(h, "k1")
	for _, name := range []string{"Set-Cookie", "Authorization"} {
		if got := second.Header().Values(name); len(got) > 0 {
			t.Errorf("a row stored by an earlier release replayed %s %q", name, got)
		}
	}
	if got := second.Header().Get("X-Request-Id"); got != "req-2" {
		t.Errorf("X-Request-Id = %q, want the current request's req-2", got)
	}
	if got := second.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q, want the stored application/json", got)
	}

	// The status handler replays with the same policy.
	status, err := phase.StatusHandler(a.c, a.w, phase.StatusConfig{
		Tenant: func(r *http.Request) (string, error) { return "acme", nil },
		Key:    func(r *http.Request) (string, error) { return "k1", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	status.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/signup/k1", nil))
	if rec.Code != http.StatusCreated || len(rec.Header().Values("Set-Cookie")) > 0 {
		t.Errorf("status handler: %d, Set-Cookie %q; want 201 without it", rec.Code, rec.Header().Values("Set-Cookie"))
	}
}

func TestAdjustReplayChangesOnlyReplays(t *testing.T) {
	t.Parallel()
	a := setupAnswering(t, "signup", nil, loggedIn)
	h := a.handler(t, func(cfg *phase.HTTPConfig[signup]) {
		cfg.AdjustReplay = func(r *http.Request, resp *keyrow.Response) {
			resp.Header.Set("Cache-Control", "no-store")
			resp.Status = http.StatusOK
		}
	})
	first := postSignup(h, "k1")
	if first.Code != http.StatusCreated || first.Header().Get("Cache-Control") != "" {
		t.Fatalf("the first answer was adjusted: %d %q", first.Code, first.Header().Get("Cache-Control"))
	}
	second := postSignup(h, "k1")
	if second.Code != http.StatusOK || second.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("replay: %d, Cache-Control %q; want the adjusted 200, no-store", second.Code, second.Header().Get("Cache-Control"))
	}
	third := postSignup(h, "k1")
	if third.Code != http.StatusOK || third.Body.String() != first.Body.String() {
		t.Errorf("a later replay: %d %q; an adjustment must not change what is stored", third.Code, third.Body)
	}
}

func TestStoreResponsesRefusesHeadersThatAreNeverStored(t *testing.T) {
	t.Parallel()
	w, err := phase.NewWorkflow("signup", phase.Local("answered",
		func(ctx context.Context, tx pgx.Tx, in *phase.Input[signup, struct{}]) (phase.Result, error) {
			return phase.Next(), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []phase.StoreConfig{
		{ReplayHeaders: []string{"set-cookie"}},
		{ReplayHeaders: []string{"Authorization"}},
		{ReplayHeaders: []string{"Transfer-Encoding"}},
		{Retention: -1},
		{MaxResponseBytes: -2},
	} {
		if err := w.StoreResponses(cfg); err == nil {
			t.Errorf("StoreResponses(%+v) = nil, want an error", cfg)
		}
	}
}

// bigResponse is 8 MiB of JSON.
func bigResponse() phase.Result {
	return phase.Respond(http.StatusOK, http.Header{"Content-Type": {"application/json"}},
		append(append([]byte(`{"blob":"`), bytes.Repeat([]byte("x"), 8<<20-11)...), `"}`...))
}

// postReal sends the request through a real server, so that a response
// without Content-Length would arrive chunked.
func postReal(t *testing.T, url, key string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"email":"a@example.com"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentLength != int64(len(body)) || len(resp.TransferEncoding) > 0 {
		t.Errorf("%s: Content-Length %d, Transfer-Encoding %q for a body of %d bytes", key, resp.ContentLength, resp.TransferEncoding, len(body))
	}
	return resp, body
}

func TestResponseOverTheLimitReachesItsCallerAndRetriesAreToldItWasProcessed(t *testing.T) {
	t.Parallel()
	a := setupAnswering(t, "export", nil, bigResponse)
	srv := httptest.NewServer(a.handler(t))
	defer srv.Close()

	first, body := postReal(t, srv.URL, "k1")
	if first.StatusCode != http.StatusOK || len(body) != 8<<20 {
		t.Fatalf("first caller: %d with %d bytes, want 200 with the whole 8 MiB", first.StatusCode, len(body))
	}
	var size int
	if err := a.db.QueryRow(context.Background(), `SELECT length(response_body) FROM idempotency_keys`).Scan(&size); err != nil {
		t.Fatal(err)
	}
	if size > phase.DefaultMaxResponseBytes {
		t.Errorf("the key stores %d bytes, over the %d-byte limit", size, phase.DefaultMaxResponseBytes)
	}
	retry, body := postReal(t, srv.URL, "k1")
	var p struct {
		Type   string `json:"type"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("retry body %q: %v", body, err)
	}
	if retry.StatusCode != http.StatusInternalServerError || p.Type != "urn:atomicphase:problem:response-not-stored" ||
		!strings.Contains(p.Detail, "status 200") || a.runs.Load() != 1 {
		t.Errorf("retry: %d %+v after %d runs; want the response-not-stored problem naming status 200, and one run",
			retry.StatusCode, p, a.runs.Load())
	}
}

func TestResponseUnderAWorkflowsLimitIsReplayedWithContentLength(t *testing.T) {
	t.Parallel()
	a := setupAnswering(t, "export", &phase.StoreConfig{MaxResponseBytes: 16 << 20}, bigResponse)
	srv := httptest.NewServer(a.handler(t))
	defer srv.Close()

	_, first := postReal(t, srv.URL, "k1")
	retry, again := postReal(t, srv.URL, "k1")
	if retry.Header.Get(phase.ReplayedHeader) != "true" || !bytes.Equal(first, again) {
		t.Errorf("retry: replayed %q, %d bytes equal to the first: %v", retry.Header.Get(phase.ReplayedHeader), len(again), bytes.Equal(first, again))
	}
}

func created() phase.Result { return phase.JSON(http.StatusCreated, map[string]int{"id": 1}) }

// finishedAgo ages the finished keys of workflow.
func finishedAgo(t *testing.T, db *pgxpool.Pool, workflow, age string) {
	t.Helper()
	if _, err := db.Exec(context.Background(),
		`UPDATE idempotency_keys SET finished_at = now() - $2::interval, last_run_at = now() - $2::interval, created_at = now() - $2::interval WHERE workflow = $1`,
		workflow, age); err != nil {
		t.Fatal(err)
	}
}

func keysOf(t *testing.T, db *pgxpool.Pool, workflow string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE workflow = $1`, workflow).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAReaperNeverDeletesTheKeysOfAWorkflowKeptLonger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	// Two services on one database: payouts kept 30 days, orders 24 hours.
	payouts := newAnswering(t, db, "payouts", &phase.StoreConfig{Retention: 30 * 24 * time.Hour}, created)
	orders := newAnswering(t, db, "orders", nil, created)
	postSignup(payouts.handler(t), "p1")
	postSignup(orders.handler(t), "o1")
	finishedAgo(t, db, "payouts", "2 days")
	finishedAgo(t, db, "orders", "2 days")

	if _, err := orders.c.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if n := keysOf(t, db, "payouts"); n != 1 {
		t.Fatalf("the orders client's reaper deleted a payout key inside its 30-day retention (%d left)", n)
	}
	if n := keysOf(t, db, "orders"); n != 0 {
		t.Errorf("the orders client kept %d of its own keys past their retention", n)
	}

	// A process that runs payouts with the default retention (an older
	// configuration, during a deploy) keeps the key for the 30 days it
	// recorded.
	w, err := phase.NewWorkflow("payouts", phase.Local("answered",
		func(ctx context.Context, tx pgx.Tx, in *phase.Input[signup, struct{}]) (phase.Result, error) {
			return created(), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	short, err := phase.NewClient(db, &phase.Config{Logger: quiet}, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := short.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if n := keysOf(t, db, "payouts"); n != 1 {
		t.Fatalf("a reaper with a 24-hour retention deleted a key that recorded 30 days (%d left)", n)
	}
	replay := postSignup(payouts.handler(t), "p1")
	if replay.Header().Get(phase.ReplayedHeader) != "true" || payouts.runs.Load() != 1 {
		t.Errorf("the payout retry inside its retention was not a replay (runs %d)", payouts.runs.Load())
	}

	finishedAgo(t, db, "payouts", "31 days")
	if res, err := payouts.c.Reap(ctx); err != nil || res.Reaped != 1 {
		t.Errorf("Reap after 31 days = %+v, %v; want the payout key deleted", res, err)
	}
}

func TestAReaperLeavesAbandonedKeysOfOtherWorkflowsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	payouts := newAnswering(t, db, "payouts", &phase.StoreConfig{Retention: 30 * 24 * time.Hour}, created)
	orders := newAnswering(t, db, "orders", nil, created)
	// A payout key abandoned unfinished two days ago.
	if _, err := db.Exec(ctx, `
		INSERT INTO idempotency_keys (tenant, idempotency_key, workflow, definition, request_fingerprint, request_params, created_at, last_run_at, retain_for)
		VALUES ('acme', 'p1', 'payouts', $1, sha256('p1'), '{}', now() - interval '2 days', now() - interval '2 days', interval '30 days')`,
		payouts.w.Definition()); err != nil {
		t.Fatal(err)
	}
	if res, err := orders.c.Reap(ctx); err != nil || res.Abandoned != 0 {
		t.Fatalf("the orders reaper: %+v, %v; want the payout key left alone", res, err)
	}
	if res, err := payouts.c.Reap(ctx); err != nil || res.Abandoned != 0 {
		t.Fatalf("the payouts reaper: %+v, %v; want the key kept for its 30 days", res, err)
	}
	var finished bool
	if err := db.QueryRow(ctx, `SELECT finished_at IS NOT NULL FROM idempotency_keys`).Scan(&finished); err != nil || finished {
		t.Errorf("the abandoned payout key was closed (%v, %v)", finished, err)
	}
}

func TestARetryAfterItsKeyWasReapedRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := setupAnswering(t, "orders", nil, created)
	h := a.handler(t)
	postSignup(h, "k1")
	finishedAgo(t, a.db, "orders", "25 hours")
	if res, err := a.c.Reap(ctx); err != nil || res.Reaped != 1 {
		t.Fatalf("Reap = %+v, %v; want one key deleted", res, err)
	}
	retry := postSignup(h, "k1")
	if retry.Code != http.StatusCreated || retry.Header().Get(phase.ReplayedHeader) != "" || a.runs.Load() != 2 {
		t.Errorf("retry after the retention: %d, replayed %q, runs %d; want a new run",
			retry.Code, retry.Header().Get(phase.ReplayedHeader), a.runs.Load())
	}
}

func TestAnswersTheWorkflowGivesAreStoredWhateverTheirStatus(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusBadRequest, http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			a := setupAnswering(t, "orders", nil, func() phase.Result {
				return phase.Respond(status, http.Header{"Content-Type": {"application/json"}, "Retry-After": {"30"}}, []byte(`{"error":"no"}`))
			})
			h := a.handler(t)
			first := postSignup(h, "k1")
			retry := postSignup(h, "k1")
			if first.Code != status || first.Header().Get("Retry-After") != "30" {
				t.Errorf("first: %d, Retry-After %q; want %d with the workflow's header", first.Code, first.Header().Get("Retry-After"), status)
			}
			if retry.Code != status || retry.Header().Get(phase.ReplayedHeader) != "true" || a.runs.Load() != 1 {
				t.Errorf("retry: %d, replayed %q, runs %d; want the stored %d", retry.Code, retry.Header().Get(phase.ReplayedHeader), a.runs.Load(), status)
			}
			if got := retry.Header().Get("Retry-After"); got != "" {
				t.Errorf("the replay carries the first answer's Retry-After %q, which is not a header of the resource", got)
			}
		})
	}
}

func TestAPanicInAdjustReplaySaysTheRequestWasProcessed(t *testing.T) {
	t.Parallel()
	a := setupAnswering(t, "signup", nil, loggedIn)
	h := a.handler(t, func(cfg *phase.HTTPConfig[signup]) {
		cfg.AdjustReplay = func(r *http.Request, resp *keyrow.Response) { panic("bug") }
	})
	postSignup(h, "k1")
	retry := postSignup(h, "k1")
	if retry.Code != http.StatusInternalServerError || !strings.Contains(retry.Body.String(), "already processed") || a.runs.Load() != 1 {
		t.Errorf("retry: %d %q after %d runs; want a 500 that says the request was processed", retry.Code, retry.Body, a.runs.Load())
	}
}

// TestAClientWarnsOfARetentionShorterThanTheCompletersWait checks that
// NewClient warns, naming the workflow, when its keys are kept for less
// than a lease and the completer's StuckAfter (the reaper would close a
// crashed key as abandoned before the completer may finish it), and says
// nothing for one kept long enough.
func TestAClientWarnsOfARetentionShorterThanTheCompletersWait(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	brief := newAnswering(t, db, "brief", &phase.StoreConfig{Retention: 30 * time.Second}, created)
	kept := newAnswering(t, db, "kept", &phase.StoreConfig{Retention: 81 * time.Second}, created)
	var logs syncBuffer
	cfg := &phase.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), LeaseTTL: 20 * time.Second,
		Completer: recovery.CompleterConfig{StuckAfter: time.Minute}}
	if _, err := phase.NewClient(db, cfg, brief.w, kept.w); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "workflow=brief") || !strings.Contains(out, "retention=30s") {
		t.Errorf("no warning naming workflow brief and its 30s retention; logs:\n%s", out)
	}
	if strings.Contains(out, "workflow=kept") {
		t.Errorf("a warning for workflow kept, whose 81s retention outlasts a 20s lease and a 1m stuck-after; logs:\n%s", out)
	}
}

// TestTheCompleterTimesARunsCallsApart checks the time the completer's
// pace leaves out of a key's own: a run's foreign call is summed on its
// clock, with call wrappers or without (the run then calls directly), and
// nothing else is.
func TestTheCompleterTimesARunsCallsApart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Pool(t)
	const call = 300 * time.Millisecond
	type run = phase.Input[signup, struct{}]
	w, err := phase.NewWorkflow("slowcall", phase.Foreign("called",
		func(ctx context.Context, in *run) (string, error) {
			time.Sleep(call)
			return "ok", nil
		},
		func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
			return created(), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		hooks []phase.Hook
	}{{"without call wrappers", nil}, {"with a call wrapper", []phase.Hook{passCall{}}}} {
		c, err := phase.NewClient(db, &phase.Config{Logger: quiet, Hooks: tc.hooks}, w)
		if err != nil {
			t.Fatal(err)
		}
		clocked, spent := phase.WithCallClock(ctx)
		began := time.Now()
		if _, err := w.Run(clocked, c, "acme", tc.name, signup{Email: "a@example.com"}); err != nil {
			t.Fatal(err)
		}
		took := time.Since(began)
		if got := spent(); got < call || got > took {
			t.Errorf("%s: the clock summed %s of a run that took %s with a %s call; want the call's time", tc.name, got, took, call)
		}
	}
}

// passCall is a call wrapper that only calls on.
type passCall struct{ phase.HookDefaults }

func (passCall) WrapCall(ctx context.Context, _ *phase.PhaseInfo, next func(context.Context) error) error {
	return next(ctx)
}
