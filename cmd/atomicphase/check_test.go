package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/conformance"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
)

type payment struct {
	Amount int  `json:"amount"`
	Fail   bool `json:"fail,omitempty"`
}

// paymentsServer serves phase.Handler at /payments, answering with
// mismatch for a reused key, and the number of payments made at /_count.
func paymentsServer(t *testing.T, mismatch int) string {
	t.Helper()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(t.Context(), `CREATE TABLE check_payments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount int)`); err != nil {
		t.Fatal(err)
	}
	w, err := phase.NewWorkflow("payments",
		phase.Local("paid", func(ctx context.Context, tx pgx.Tx, in *phase.Input[payment, struct{}]) (phase.Result, error) {
			if in.Req.Fail {
				return phase.Result{}, fmt.Errorf("the card network is down")
			}
			time.Sleep(100 * time.Millisecond) // the card network's latency
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO check_payments (amount) VALUES ($1) RETURNING id`, in.Req.Amount).Scan(&id)
			return phase.JSON(http.StatusCreated, map[string]int64{"id": id}), err
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, w)
	if err != nil {
		t.Fatal(err)
	}
	h, err := phase.Handler(c, w, phase.HTTPConfig[payment]{
		Tenant:         func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
		MismatchStatus: mismatch,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", h)
	mux.HandleFunc("GET /_count", func(w http.ResponseWriter, r *http.Request) {
		var n int64
		_ = pool.QueryRow(r.Context(), `SELECT count(*) FROM check_payments`).Scan(&n)
		fmt.Fprintf(w, `{"payments": %d}`, n)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// Pasted flags of a curl command check phase.Handler: every scenario but
// the restart one runs, and passes.
func TestCheckPassesAgainstPhaseHandler(t *testing.T) {
	t.Parallel()
	base := paymentsServer(t, 0)
	r := runCLI(t, "", "check", "-H", "Authorization: acme", "-H", "Content-Type: application/json",
		"-d", `{"amount": 500}`, "-H2", "Authorization: globex", "-d500", `{"amount": 500, "fail": true}`,
		base+"/payments", "-effects", base+"/_count#payments")
	t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("atomicphase check = %d, want 0", r.code)
	}
	for _, s := range conformance.Scenarios() {
		want := " pass "
		if s.Name == "restart" {
			want = " skip "
		}
		if !strings.Contains(lineOf(r.stdout, s.Name), want) {
			t.Errorf("scenario %s: %q, want %s", s.Name, lineOf(r.stdout, s.Name), want)
		}
	}
	for _, want := range []string{"other request: made from the request by changing \"amount\" from 500 to 501", "14 passed, 0 differ from the profile, 1 skipped, 0 failed"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the report does not say %q", want)
		}
	}
}

func lineOf(out, scenario string) string {
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, scenario+" ") {
			return line
		}
	}
	return ""
}

// An endpoint that answers a reused key with 400 passes the default
// profile; the atomicphase profile reports its mismatch scenarios as
// differing (exit 0, saying why), and fails them only with -strict (exit
// 1); Stripe's passes it even strictly.
func TestCheckJudgesByTheProfile(t *testing.T) {
	t.Parallel()
	base := paymentsServer(t, http.StatusBadRequest)
	args := []string{"check", "-json", "-H", "Authorization: acme", "-H", "Content-Type: application/json", "-d", `{"amount": 500}`}
	if r := runCLI(t, "", append(args, base+"/payments")...); r.code != exitOK {
		t.Errorf("atomicphase check = %d, want 0:\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, strict := range []bool{false, true} {
		a := append(slices.Clone(args), "-profile", "atomicphase")
		want := exitOK
		if strict {
			a, want = append(a, "-strict"), exitError
		}
		r := runCLI(t, "", append(a, base+"/payments")...)
		if r.code != want {
			t.Fatalf("atomicphase %q = %d, want %d:\n%s%s", a, r.code, want, r.stdout, r.stderr)
		}
		rep := decode[conformance.Report](t, r.stdout)
		for _, res := range rep.Results {
			differs := res.Scenario == "mismatch" || res.Scenario == "in-flight-mismatch"
			if differs != (res.Verdict == conformance.Differs) || res.Verdict == conformance.Fail {
				t.Errorf("%s: %s (%s)", res.Scenario, res.Verdict, res.Why)
			}
			if res.Scenario == "mismatch" && !strings.Contains(res.Why, "the key reused with another body was answered 400; the profile answers 422") {
				t.Errorf("mismatch differs for %q", res.Why)
			}
			// -json shows every body whole.
			if res.Scenario == "key-missing" && !strings.Contains(res.Got, `"detail":"Idempotency-Key header is missing"}`) {
				t.Errorf("key-missing got %q, not the whole problem", res.Got)
			}
		}
	}
	if r := runCLI(t, "", append(args, "-profile", "stripe", "-strict", base+"/payments")...); r.code != exitOK {
		t.Errorf("atomicphase check -profile stripe -strict = %d, want 0:\n%s", r.code, r.stdout)
	}
}

func TestCheckUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"check", "-d", "x"}, "want one URL, got 0"},
		{[]string{"check", "http://127.0.0.1:1/"}, "-d is required"},
		{[]string{"check", "-d", "x", "-profile", "paypal", "http://127.0.0.1:1/"}, `no profile "paypal"; the profiles are generic, ietf, stripe, atomicphase`},
		{[]string{"check", "-d", "x", "-H", "Authorization", "http://127.0.0.1:1/"}, `header "Authorization" is not 'Name: value'`},
		{[]string{"check", "-d", "x", "127.0.0.1:1"}, "is not an absolute http or https URL"},
		{[]string{"check", "-d", "@/nonexistent", "http://127.0.0.1:1/"}, "no such file"},
		{[]string{"check", "-d", "x", "-storm", "0", "http://127.0.0.1:1/"}, "-storm 0: send 2 to 1000 requests at once"},
		{[]string{"check", "-d", "x", "-storm", "1", "http://127.0.0.1:1/"}, "-storm 1: send 2 to 1000 requests at once"},
	} {
		// One line says what is wrong, one where the flags are.
		r := runCLI(t, "", tc.args...)
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		if r.code != exitUsage || len(lines) != 2 || !strings.Contains(lines[0], tc.want) || lines[1] != "Run 'atomicphase check -h' for the flags." {
			t.Errorf("atomicphase %q = %d, want 2, %q and the hint:\n%s", tc.args, r.code, tc.want, r.stderr)
		}
		if strings.Contains(r.stderr, "conformance:") {
			t.Errorf("atomicphase %q names the package: %s", tc.args, r.stderr)
		}
	}
	r := runCLI(t, "", "check", "-h")
	for _, want := range []string{"-d2", "-H2", "-d500", "-profile", "-strict", "-settle-timeout", "-effects", "-restart", "test tenant", "storm", "differs"} {
		if r.code != exitOK || !strings.Contains(r.stdout, want) {
			t.Errorf("atomicphase check -h (%d) does not document %s", r.code, want)
		}
	}
	if help := runCLI(t, "", "help"); !strings.Contains(help.stdout, "check URL") {
		t.Error("atomicphase help does not list check")
	}
}

// A JSON body pasted without -H 'Content-Type: …' is sent as JSON, which
// phase.Handler accepts (it refuses a form), and the other request is made
// from it, so that the scenarios that reuse a key with another body run.
// The table stays within 100 columns.
func TestCheckSendsAJSONBodyAsJSON(t *testing.T) {
	t.Parallel()
	base := paymentsServer(t, 0)
	r := runCLI(t, "", "check", "-H", "Authorization: acme", "-d", `{"amount": 500}`, base+"/payments")
	t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	if r.code != exitOK {
		t.Fatalf("atomicphase check = %d, want 0", r.code)
	}
	for _, want := range []string{"(Content-Type application/json)", `other request: made from the request by changing "amount" from 500 to 501`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the report does not say %q", want)
		}
	}
	for _, s := range []string{"mismatch", "in-flight-mismatch"} {
		if !strings.Contains(lineOf(r.stdout, s), " pass ") {
			t.Errorf("%s: %q, want pass", s, lineOf(r.stdout, s))
		}
	}
	table := r.stdout[strings.Index(r.stdout, "SCENARIO"):strings.Index(r.stdout, " passed, ")]
	for line := range strings.Lines(table) {
		if n := len([]rune(strings.TrimSuffix(line, "\n"))); n > 100 {
			t.Errorf("a line of the table is %d columns wide: %s", n, line)
		}
	}
}

// counting serves /charges, counting the requests it gets, and /_count,
// which answers body.
func counting(t *testing.T, body string) (string, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/charges", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("/_count", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL, &hits
}

// A mistake that would make every scenario fail alike, or skip the
// scenarios that see a missing fingerprint, stops the check before its
// first request, with one line that says what is wrong and a hint.
func TestCheckStopsBeforeTheFirstRequestOnAWrongInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, count string
		args        []string
		want        string
	}{
		{"a field -effects does not have", `{"payments": 3, "refunds": 0}`, []string{"-effects", "/_count#charges"},
			`has no field "charges"; its fields are payments, refunds`},
		{"a JSON object without #field", `{"payments": 3}`, []string{"-effects", "/_count"},
			"answered a JSON object; name the field after '#'"},
		{"a field that is not a number", `{"payments": "three"}`, []string{"-effects", "/_count#payments"},
			`field "payments" is "three", not an integer`},
		{"no other body can be made", "0", []string{"-d", "hello"}, "no other request to reuse a key with"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base, hits := counting(t, tc.count)
			args := []string{"check", "-d", `{"amount": 500}`}
			for _, a := range tc.args {
				if strings.HasPrefix(a, "/") {
					a = base + a
				}
				args = append(args, a)
			}
			r := runCLI(t, "", append(args, base+"/charges")...)
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if r.code != exitUsage || len(lines) != 2 || !strings.Contains(lines[0], tc.want) || r.stdout != "" {
				t.Errorf("atomicphase %q = %d, want 2 and one line with %q:\n%s%s", args, r.code, tc.want, r.stdout, r.stderr)
			}
			if strings.Contains(r.stderr, "strconv") {
				t.Errorf("the error is Go's, not the command's: %s", r.stderr)
			}
			if n := hits.Load(); n != 0 {
				t.Errorf("the endpoint got %d requests", n)
			}
		})
	}
}

// slowOrders serves an in-memory Idempotency-Key endpoint at /orders that
// takes 300 ms per order and answers 409 with Retry-After while a key is
// in flight; a request whose key contains hang is never answered.
func slowOrders(t *testing.T, hang string) string {
	t.Helper()
	var mu sync.Mutex
	type order struct {
		body   string
		answer []byte
	}
	keys := map[string]*order{}
	var orders atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		switch {
		case hang != "" && strings.Contains(key, hang):
			<-r.Context().Done()
			return
		case key == "" || len(r.Header.Values("Idempotency-Key")) > 1:
			http.Error(w, "one Idempotency-Key, please", http.StatusBadRequest)
			return
		}
		key = r.Header.Get("Authorization") + " " + key
		mu.Lock()
		k, seen := keys[key]
		if !seen {
			k = &order{body: string(body)}
			keys[key] = k
		}
		stored := k.answer
		mu.Unlock()
		switch {
		case seen && k.body != string(body):
			http.Error(w, "the key was used with another body", http.StatusUnprocessableEntity)
		case seen && stored == nil:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "in progress", http.StatusConflict)
		case seen:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(stored)
		default:
			time.Sleep(300 * time.Millisecond)
			b := fmt.Appendf(nil, `{"order": %d}`, orders.Add(1))
			mu.Lock()
			k.answer = b
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(b)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A failing -restart command fails the restart scenario with the end of
// what it wrote to stderr; the report, a long URL's header and the lines
// of the scenarios that did not pass included, keeps within 100 columns;
// -json gives each answer field by field, every request of a storm
// included, and the totals.
func TestCheckReportsARestartThatFailsWithin100Columns(t *testing.T) {
	t.Parallel()
	url := slowOrders(t, "") + "/orders?tenant=" + strings.Repeat("acme", 30)
	args := []string{"check", "-d", `{"amount": 500}`, "-storm", "4", "-restart", "echo 'restart: no such service: orders' >&2; exit 3", url}
	r := runCLI(t, "", args...)
	t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	if r.code != exitError || !strings.Contains(lineOf(r.stdout, "restart"), " fail ") {
		t.Fatalf("atomicphase check = %d, want 1 and restart failed", r.code)
	}
	if !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), `exit status 3: restart: no such service: orders`) {
		t.Error("the report does not show what the restart command wrote")
	}
	for line := range strings.Lines(r.stdout) {
		if n := len([]rune(strings.TrimSuffix(line, "\n"))); n > 100 {
			t.Errorf("a line is %d columns wide: %s", n, line)
		}
	}
	r = runCLI(t, "", append([]string{"check", "-json"}, args[1:]...)...)
	rep := decode[conformance.Report](t, r.stdout)
	if rep.Totals.Failed == 0 || rep.Totals.Passed+rep.Totals.Differs+rep.Totals.Skipped+rep.Totals.Failed != len(rep.Results) {
		t.Errorf("totals %+v for %d results", rep.Totals, len(rep.Results))
	}
	for _, res := range rep.Results {
		switch res.Scenario {
		case "replay":
			if len(res.Answers) != 2 || res.Answers[1].Status != http.StatusCreated || res.Answers[1].Replayed != "Idempotent-Replayed" || res.Answers[1].Body != res.Answers[0].Body {
				t.Errorf("replay answers %+v", res.Answers)
			}
		case "storm":
			if len(res.Answers) != 5 || !strings.HasPrefix(res.Answers[0].Body, `{"order": `) && res.Answers[0].Status != http.StatusConflict {
				t.Errorf("storm answers %+v, want the 4 of the storm and the retry", res.Answers)
			}
		}
	}
}

// A check that -timeout ends in the middle of a scenario says so, not
// what its cut requests looked like.
func TestCheckNamesItsTimeout(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "", "check", "-d", `{"amount": 500}`, "-timeout", "3s", slowOrders(t, "-replay-")+"/orders")
	t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	out := strings.Join(strings.Fields(r.stdout), " ")
	if r.code != exitError || !strings.Contains(out, "replay: fail") || !strings.Contains(out, "the check was stopped during the scenario, before it could judge: the check's -timeout 3s ran out") {
		t.Errorf("atomicphase check = %d, want 1 naming -timeout", r.code)
	}
	if strings.Contains(out, "check the URL") || strings.Contains(out, "-d500") {
		t.Error("the report blames the request")
	}
}
