package fakeapi_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/fakeapi"
	"github.com/atomicphase/atomicphase/examples/internal/fakeapi/fakeapitest"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// counter is a fake whose one route, POST /v1/counts, executes by counting:
// each execution answers with the number of executions so far, so a replay
// is told from a second execution by its body.
type counter struct {
	api  *fakeapi.Server
	url  string
	runs atomic.Int64
	// failRun makes the next execution fail after it has counted.
	failRun atomic.Bool
}

func setup(t *testing.T, db *pgxpool.Pool, cfg fakeapi.Config) *counter {
	t.Helper()
	if err := cfg.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	if cfg.Action == "" {
		cfg.Action = "count"
	}
	c := &counter{api: fakeapi.New(db, cfg, fakeapi.Options{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})}
	c.api.Handle("POST /v1/counts", func(w http.ResponseWriter, r *http.Request, call fakeapi.Call) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			c.api.Fail(w, call, err)
			return
		}
		c.api.Execute(w, r, call, fakeapi.Execution{
			Params: body,
			Run: func(context.Context, pgx.Tx, string) (fakeapi.Response, error) {
				n := c.runs.Add(1)
				if c.failRun.CompareAndSwap(true, false) {
					return fakeapi.Response{}, errors.New("the count is lost")
				}
				return fakeapi.JSON(http.StatusOK, map[string]int64{"n": n}), nil
			},
			Committed: func() {
				if slices.Contains(cfg.Counts, "counted") {
					c.api.Count("counted")
				}
			},
		})
	})
	// GET /v1/counts/{id} finds the counts made so far.
	c.api.Handle("GET /v1/counts/{id}", func(w http.ResponseWriter, r *http.Request, call fakeapi.Call) {
		c.api.Retrieve(w, r, call, "count", func(_ context.Context, id string) (any, error) {
			n, err := strconv.ParseInt(id, 10, 64)
			if err != nil || n < 1 || n > c.runs.Load() {
				return nil, pgx.ErrNoRows
			}
			return map[string]int64{"n": n}, nil
		})
	})
	hs := httptest.NewServer(c.api)
	t.Cleanup(hs.Close)
	c.url = hs.URL
	return c
}

// answer is a response with its body read.
type answer struct {
	status int
	header http.Header
	body   string
}

func (c *counter) do(t *testing.T, method, path string, header http.Header, body string) answer {
	t.Helper()
	res, b := fakeapitest.Do(t, method, c.url+path, header, body)
	return answer{res.StatusCode, res.Header, string(b)}
}

// count posts body under key.
func (c *counter) count(t *testing.T, key, body string, header http.Header) answer {
	t.Helper()
	h := http.Header{"Idempotency-Key": {key}}
	for k, v := range header {
		h[k] = v
	}
	return c.do(t, http.MethodPost, "/v1/counts", h, body)
}

func TestSameKeyReplaysAndOtherParamsAreRefused(t *testing.T) {
	t.Parallel()
	c := setup(t, pgtest.Pool(t), fakeapi.Config{Name: "counter"})

	first := c.count(t, "k1", "a", nil)
	again := c.count(t, "k1", "a", nil)
	if first.status != http.StatusOK || again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Original-Request") != first.header.Get("Request-Id") {
		t.Errorf("replay: %d %q %v, want %q replayed from request %s",
			again.status, again.body, again.header, first.body, first.header.Get("Request-Id"))
	}
	if other := c.count(t, "k1", "b", nil); other.status != http.StatusBadRequest || !strings.Contains(other.body, "idempotency_error") {
		t.Errorf("other params: %d %s", other.status, other.body)
	}
	if n := c.runs.Load(); n != 1 {
		t.Errorf("executed %d times, want 1", n)
	}
	if s := c.api.Stats(); s.Requests != 3 || s.Replays != 1 {
		t.Errorf("stats %+v, want 3 requests and 1 replay", s)
	}
}

// Each fake's keys are its own, and within a fake each caller's.
func TestKeysBelongToTheirFakeAndCaller(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	byHeader := func(w http.ResponseWriter, r *http.Request) (string, bool) { return r.Header.Get("Caller"), true }
	a := setup(t, db, fakeapi.Config{Name: "counter_a", Authenticate: byHeader})
	b := setup(t, db, fakeapi.Config{Name: "counter_b", Authenticate: byHeader})

	for _, send := range []struct {
		fake   *counter
		caller string
	}{{a, "alice"}, {a, "bob"}, {b, "alice"}} {
		if got := send.fake.count(t, "k1", "x", http.Header{"Caller": {send.caller}}); got.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("%s's request replayed another's answer: %s", send.caller, got.body)
		}
	}
	if got := a.count(t, "k1", "x", http.Header{"Caller": {"alice"}}); got.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("alice's retry was not replayed: %d %s", got.status, got.body)
	}
	if na, nb := a.runs.Load(), b.runs.Load(); na != 2 || nb != 1 {
		t.Errorf("executions %d and %d, want 2 and 1", na, nb)
	}
}

func TestRequireKeyRefusesRequestsWithoutOne(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	optional := setup(t, db, fakeapi.Config{Name: "optional"})
	required := setup(t, db, fakeapi.Config{Name: "required", RequireKey: true})

	for range 2 {
		if got := optional.count(t, "", "x", nil); got.status != http.StatusOK || got.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("optional, no key: %d %s", got.status, got.body)
		}
	}
	if got := required.count(t, " ", "x", nil); got.status != http.StatusBadRequest {
		t.Errorf("required, blank key: %d %s", got.status, got.body)
	}
	if got := required.count(t, strings.Repeat("k", fakeapi.MaxKeyLength+1), "x", nil); got.status != http.StatusBadRequest {
		t.Errorf("required, long key: %d %s", got.status, got.body)
	}
	if n, m := optional.runs.Load(), required.runs.Load(); n != 2 || m != 0 {
		t.Errorf("executions %d and %d, want 2 and 0", n, m)
	}
}

// A failure of the execution itself, like an injected failure before it,
// stores nothing, so the retry executes; a drop after it stores the answer,
// so the retry replays it.
func TestFailuresLeaveTheKeyFreeAndDropsReplay(t *testing.T) {
	t.Parallel()
	c := setup(t, pgtest.Pool(t), fakeapi.Config{Name: "counter"})

	c.failRun.Store(true)
	if got := c.count(t, "failed-run", "x", nil); got.status != http.StatusInternalServerError {
		t.Errorf("failed execution: %d %s", got.status, got.body)
	}
	if got := c.count(t, "failed-run", "x", nil); got.status != http.StatusOK || got.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry after a failed execution: %d %s", got.status, got.body)
	}

	if _, err := c.api.ChangeFaults(func(f *fakeapi.Faults) error { f.FailBefore, f.TimeoutAfter = 1, 1; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := c.count(t, "faulty", "x", nil); got.status != http.StatusInternalServerError {
		t.Errorf("failure before: %d %s", got.status, got.body)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, c.url+"/v1/counts", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "faulty")
	// A connection of its own, so that the transport cannot resend the
	// request on another and hide the drop.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if res, err := client.Do(req); err == nil {
		res.Body.Close()
		t.Errorf("drop after: got %s, want a network error", res.Status)
	}
	if got := c.count(t, "faulty", "x", nil); got.header.Get("Idempotent-Replayed") != "true" || got.body != "{\n  \"n\": 3\n}\n" {
		t.Errorf("retry after the drop: %s, want the replay of the third execution", got.body)
	}
	if s := c.api.Stats(); s.FaultsInjected != 2 {
		t.Errorf("stats %+v, want 2 faults", s)
	}
}

func TestFaultsOverHTTPAreNamedForTheAction(t *testing.T) {
	t.Parallel()
	c := setup(t, pgtest.Pool(t), fakeapi.Config{Name: "counter", Action: "widget"})
	jsonHeader := http.Header{"Content-Type": {"application/json"}}

	post := func(body string) answer { return c.do(t, http.MethodPost, "/_faults", jsonHeader, body) }
	post(`{"fail_before_widget": 2, "delay_ms": 3}`)
	got := post(`{"timeout_after_widget_rate": 0.5, "fail_before_widget": null}`)
	want := `{
  "fail_before_widget": 2,
  "timeout_after_widget": 0,
  "fail_before_widget_rate": 0,
  "timeout_after_widget_rate": 0.5,
  "delay_ms": 3
}
`
	if got.status != http.StatusOK || got.body != want {
		t.Errorf("POST /_faults: %d\n%s\nwant\n%s", got.status, got.body, want)
	}
	for _, bad := range []string{`{"fail_before_count": 1}`, `{"timeout_after_widget": -1, "delay_ms": 9}`, `{"delay_ms": "soon"}`, `[]`} {
		if got := post(bad); got.status != http.StatusBadRequest || !strings.Contains(got.body, "Invalid fault plan") {
			t.Errorf("POST /_faults %s: %d %s", bad, got.status, got.body)
		}
	}
	if got := c.do(t, http.MethodGet, "/_faults", nil, ""); got.body != want {
		t.Errorf("GET /_faults after refused changes:\n%s\nwant\n%s", got.body, want)
	}
}

func TestStatsAnswerTheFakesOwnCountsAfterRequests(t *testing.T) {
	t.Parallel()
	c := setup(t, pgtest.Pool(t), fakeapi.Config{Name: "counter", Counts: []string{"counted", "never"}})
	c.count(t, "k1", "a", nil)
	c.count(t, "k1", "a", nil)

	got := c.do(t, http.MethodGet, "/_stats", nil, "")
	// The members in this order, the fake's own after requests.
	want := `{"requests":2,"counted":1,"never":0,"replays":1,"conflicts":0,"faults_injected":0}`
	if body := strings.Join(strings.Fields(got.body), ""); got.status != http.StatusOK || body != want {
		t.Errorf("GET /_stats: %d %s, want %s", got.status, body, want)
	}
	if s := c.api.Stats(); s.Counts["counted"] != 1 || s.Counts["never"] != 0 || len(s.Counts) != 2 {
		t.Errorf("Stats().Counts = %v, want counted 1 and never 0", s.Counts)
	}
}

func TestRetrieveAnswersTheObjectOrStripes404(t *testing.T) {
	t.Parallel()
	c := setup(t, pgtest.Pool(t), fakeapi.Config{Name: "counter"})
	c.count(t, "k1", "a", nil)

	if got := c.do(t, http.MethodGet, "/v1/counts/1", nil, ""); got.status != http.StatusOK || got.body != "{\n  \"n\": 1\n}\n" {
		t.Errorf("GET /v1/counts/1: %d %s", got.status, got.body)
	}
	got := c.do(t, http.MethodGet, "/v1/counts/2", nil, "")
	if got.status != http.StatusNotFound || !strings.Contains(got.body, `"resource_missing"`) || !strings.Contains(got.body, "No such count: '2'") {
		t.Errorf("GET /v1/counts/2: %d %s", got.status, got.body)
	}
}

func TestUnrecognizedRouteIsAJSON404(t *testing.T) {
	t.Parallel()
	c := setup(t, pgtest.Pool(t), fakeapi.Config{Name: "counter"})
	if got := c.do(t, http.MethodDelete, "/v1/counts", nil, ""); got.status != http.StatusNotFound || !strings.Contains(got.body, "Unrecognized request URL (DELETE: /v1/counts)") {
		t.Errorf("%d %s", got.status, got.body)
	}
}
