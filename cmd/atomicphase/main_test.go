package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const ttl = 30 * time.Second

// unreachable is a database URL nothing listens on.
const unreachable = "postgres://nobody@127.0.0.1:1/none?connect_timeout=5"

type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs the command line with DATABASE_URL set to env.
func runCLI(t *testing.T, env string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	getenv := func(name string) string {
		if name == "DATABASE_URL" {
			return env
		}
		return ""
	}
	code := run(t.Context(), args, &stdout, &stderr, getenv)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// ok runs the command line, fails the test unless it succeeds, and returns
// its output.
func ok(t *testing.T, dsn string, args ...string) string {
	t.Helper()
	r := runCLI(t, dsn, args...)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("atomicphase %q = %d, stderr:\n%s", args, r.code, r.stderr)
	}
	return r.stdout
}

func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("-json output does not parse: %v\n%s", err, out)
	}
	return v
}

// setup returns the DSN of a fresh database for the test and a pool on it.
func setup(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	dsn := pgtest.DSN(t)
	db, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return dsn, db
}

func request(t *testing.T, tenant, key string) store.Request {
	t.Helper()
	params := []byte(`{"amount":100}`)
	fp, err := keyrow.Fingerprint("wf", params)
	if err != nil {
		t.Fatal(err)
	}
	return store.Request{Tenant: tenant, Key: key, Workflow: "wf", Fingerprint: fp, Params: params, TTL: ttl}
}

func acquire(t *testing.T, db store.Querier, tenant, key string) (store.Outcome, *store.Row) {
	t.Helper()
	out, row, err := store.Acquire(context.Background(), db, request(t, tenant, key))
	if err != nil {
		t.Fatal(err)
	}
	return out, row
}

// keyIn creates the key in state: "finished", "leased" (a live lease),
// "runnable" (free, at recovery point "charged"), "dead" or "unknown" (held
// at "charged").
func keyIn(t *testing.T, db store.Querier, tenant, key, state string) *store.Row {
	t.Helper()
	ctx := context.Background()
	out, row := acquire(t, db, tenant, key)
	if out != store.New {
		t.Fatalf("acquire %s/%s = %v, want new", tenant, key, out)
	}
	switch state {
	case "leased":
		return row
	case "finished":
		resp := keyrow.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_1"}`)}
		if err := store.Finish(ctx, db, row.Holder(), []byte(`{"charge":"ch_1"}`), resp); err != nil {
			t.Fatal(err)
		}
		return row
	}
	if err := store.Advance(ctx, db, row.Holder(), "charged", []byte(`{"charge":"ch_1"}`), ttl); err != nil {
		t.Fatal(err)
	}
	hold := map[string]keyrow.Hold{"runnable": "", "dead": keyrow.HoldDead, "unknown": keyrow.HoldUnknown}[state]
	if err := store.Release(ctx, db, row.Holder(), "card declined", hold, store.EndedIdle, false); err != nil {
		t.Fatal(err)
	}
	return row
}

// age rewrites the key's timestamps with set, an SQL assignment list, as if
// time had passed.
func age(t *testing.T, db *pgxpool.Pool, tenant, key, set string) {
	t.Helper()
	tag, err := db.Exec(context.Background(),
		`UPDATE idempotency_keys SET `+set+` WHERE tenant = $1 AND idempotency_key = $2`, tenant, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("age %s/%s: %v", tenant, key, err)
	}
	pgtest.TimePassed(t, db)
}

func stored(t *testing.T, db *pgxpool.Pool, tenant, key string) *keyrow.Row {
	t.Helper()
	info, err := store.Inspect(context.Background(), db, tenant, key)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestInspectShowsTheKeyAsTextAndJSON(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	row := keyIn(t, db, "acme", "order-1", "finished")

	text := ok(t, dsn, "inspect", "acme", "order-1")
	for _, want := range []string{"order-1", "acme", row.ID.String(), "status          finished",
		"response        201", "Content-Type: application/json", `{"id":"ch_1"}`, `{"amount":100}`, `{"charge":"ch_1"}`} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, text)
		}
	}

	info := decode[keyrow.Row](t, ok(t, dsn, "inspect", "-json", "acme", "order-1"))
	if info.ID != row.ID || info.RecoveryPoint != keyrow.Finished || *info.ResponseStatus != 201 ||
		string(info.ResponseBody) != `{"id":"ch_1"}` || info.FinishedAt == nil {
		t.Fatalf("inspect -json = %+v", info)
	}
	fields := decode[map[string]any](t, ok(t, dsn, "inspect", "--json", "acme", "order-1"))
	if fields["recovery_point"] != "finished" || fields["tenant"] != "acme" || fields["lease_left_ns"] != 0.0 ||
		fields["response_headers"] == nil {
		t.Fatalf("inspect --json fields = %v", fields)
	}
}

func TestArgumentsAfterDoubleDashMayStartWithADash(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "-order-1", "dead")
	info := decode[keyrow.Row](t, ok(t, dsn, "inspect", "-json", "--", "acme", "-order-1"))
	if info.Key != "-order-1" || info.Hold != keyrow.HoldDead {
		t.Fatalf("inspect -- acme -order-1 = %+v", info)
	}
}

func TestInspectUnlockAndRetryOfAMissingKeyExitThree(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "order-1", "dead")

	for _, args := range [][]string{
		{"inspect", "acme", "order-2"},
		{"inspect", "globex", "order-1"},
		{"unlock", "acme", "order-2"},
		{"retry", "acme", "order-2"},
	} {
		r := runCLI(t, dsn, args...)
		if r.code != exitNotFound || r.stdout != "" || !strings.Contains(r.stderr, `has no key "`+args[2]+`"`) {
			t.Errorf("atomicphase %q = %d, stdout %q, stderr %q; want 3 and the key named", args, r.code, r.stdout, r.stderr)
		}
	}
}

func TestUsageErrorsExitTwoWithTheUsageOnStderr(t *testing.T) {
	t.Parallel()
	// No database is needed to find these mistakes, and none is reached.
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{nil, "Usage: atomicphase COMMAND"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"counts", "-verbose"}, "flag provided but not defined: -verbose"},
		{[]string{"inspect", "acme"}, "want TENANT KEY, got 1 argument"},
		{[]string{"inspect", "acme", "k1", "-json"}, "flag -json must come before the arguments"},
		{[]string{"inspect", "", ""}, `TENANT must be 1 to 255 characters of valid UTF-8 without NUL, got ""`},
		{[]string{"unlock", "acme", ""}, `KEY must be 1 to 255 characters of valid UTF-8 without NUL, got ""`},
		{[]string{"retry", "acme", strings.Repeat("k", 256)}, "KEY must be 1 to 255 characters"},
		{[]string{"resolve", "-at", "charged", "-not-happened", "acme\x00", "k1"}, "TENANT must be"},
		{[]string{"counts", "extra"}, "takes no arguments"},
		{[]string{"list", "-stuck", "-dead"}, "at most one of -state, -stuck, -unknown and -dead"},
		{[]string{"list", "-state", "dead", "-unknown"}, "at most one of -state, -stuck, -unknown and -dead"},
		{[]string{"list", "-state", "bogus"}, `unknown state "bogus"`},
		{[]string{"list", "-dead", "-stuck-after", "5m"}, "-stuck-after applies only to the stuck and waiting states"},
		{[]string{"resolve", "acme", "k1"}, "pass -at"},
		{[]string{"resolve", "-at", "charged", "acme", "k1"}, "exactly one of -happened and -not-happened"},
		{[]string{"resolve", "-at", "charged", "-happened", "-output", "{", "acme", "k1"}, "-happened needs -output"},
		{[]string{"bulk"}, "exactly one of -retry and -unlock"},
		{[]string{"bulk", "-unlock", "-confirm-unknown"}, "-confirm-unknown applies only to -retry"},
		{[]string{"list", "-dead", "-limit", "0"}, "-limit must be positive"},
		{[]string{"list", "-stuck", "-stuck-after", "soon"}, "invalid value"},
		{[]string{"reap", "-retention", "0s"}, "-retention and -batch must be positive"},
		{[]string{"counts", "-stuck-after", "-1m"}, "must not be negative"},
		{[]string{"migrate", "-from", "1"}, "-from applies only to -print"},
		{[]string{"migrate", "-print", "-status"}, "pass at most one of -status and -print"},
		{[]string{"migrate", "-print", "-from", "-1"}, "-from must not be negative"},
	} {
		r := runCLI(t, unreachable, tc.args...)
		if r.code != exitUsage || r.stdout != "" || !strings.Contains(r.stderr, tc.msg) || !strings.Contains(r.stderr, "Usage: atomicphase") {
			t.Errorf("atomicphase %q = %d, stdout %q, stderr:\n%s\nwant 2 with %q and the usage", tc.args, r.code, r.stdout, r.stderr, tc.msg)
		}
	}
}

func TestHelpDocumentsEveryCommandOnStdout(t *testing.T) {
	t.Parallel()
	top := runCLI(t, "", "-h")
	if top.code != exitOK || !strings.Contains(top.stdout, "Exit status:") || !strings.Contains(top.stdout, "3  not found") {
		t.Fatalf("atomicphase -h = %d:\n%s", top.code, top.stdout)
	}
	for _, c := range commands {
		if !strings.Contains(top.stdout, "  "+c.name) {
			t.Errorf("atomicphase -h does not list %s", c.name)
		}
		r := runCLI(t, "", c.name, "-h")
		if r.code != exitOK || r.stderr != "" || !strings.Contains(r.stdout, "Usage: atomicphase "+c.name) ||
			!strings.Contains(r.stdout, "-database-url URL") || !strings.Contains(r.stdout, "-json") {
			t.Errorf("atomicphase %s -h = %d:\n%s%s", c.name, r.code, r.stdout, r.stderr)
		}
	}
	if r := runCLI(t, "", "unlock", "--help"); !strings.Contains(r.stdout, "fenced out") {
		t.Errorf("unlock help does not warn that a live holder is fenced out:\n%s", r.stdout)
	}
}

func TestMissingDatabaseURLExitsTwoAndSaysHowToSetIt(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "", "counts")
	if r.code != exitUsage || !strings.Contains(r.stderr, "DATABASE_URL is not set; pass -database-url or set DATABASE_URL") {
		t.Fatalf("stats without a database = %d:\n%s", r.code, r.stderr)
	}
}

func TestUnreachableDatabaseExitsOne(t *testing.T) {
	t.Parallel()
	r := runCLI(t, unreachable, "counts")
	if r.code != exitError || !strings.Contains(r.stderr, "connect to the database") {
		t.Fatalf("stats on an unreachable database = %d:\n%s", r.code, r.stderr)
	}
}

// Every command but migrate on a database that was never migrated says
// to run atomicphase migrate, after Postgres's own error.
func TestCommandsOnAnUnmigratedDatabaseSayToMigrate(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	if _, err := db.Exec(context.Background(), "CREATE SCHEMA unmigrated"); err != nil {
		t.Fatal(err)
	}
	empty := withSearchPath(t, dsn, "unmigrated")
	for _, args := range [][]string{{"counts"}, {"list", "-stuck"}, {"inspect", "acme", "k1"}, {"reap", "-dry-run"}} {
		r := runCLI(t, empty, args...)
		if r.code != exitError || !strings.Contains(r.stderr, "42P01") ||
			!strings.Contains(r.stderr, "no atomicphase schema") || !strings.Contains(r.stderr, "atomicphase migrate") {
			t.Errorf("atomicphase %q on an unmigrated database = %d, want 1 with a hint to run atomicphase migrate:\n%s", args, r.code, r.stderr)
		}
	}
}

// A database that does not exist, reached over TCP where pgx first asks
// for TLS, is reported by the server's answer, not by the refused TLS
// attempt that came before it.
func TestAMissingDatabaseIsReportedByTheServersAnswer(t *testing.T) {
	t.Parallel()
	cfg, err := pgconn.ParseConfig(pgtest.Server(t).AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	addr := pgtest.TCPAddr(t)
	u := url.URL{Scheme: "postgres", User: url.UserPassword(cfg.User, cfg.Password), Host: addr, Path: "/no_such_database",
		RawQuery: "sslmode=prefer&connect_timeout=10"}
	r := runCLI(t, u.String(), "counts")
	first, _, _ := strings.Cut(r.stderr, "\n")
	if r.code != exitError || !strings.Contains(first, `database "no_such_database" does not exist`) || strings.Contains(first, "TLS") {
		t.Fatalf("stats on a missing database over TCP = %d, want 1 naming the database first:\n%s", r.code, r.stderr)
	}
}

func TestDatabaseURLFlagOverridesTheEnvironment(t *testing.T) {
	t.Parallel()
	dsn, _ := setup(t)
	ok(t, unreachable, "counts", "-database-url", dsn)
	if r := runCLI(t, dsn, "counts", "--database-url="+unreachable); r.code != exitError {
		t.Fatalf("stats with an unreachable -database-url = %d, want 1:\n%s", r.code, r.stderr)
	}
}

func TestListShowsStuckUnknownAndDeadKeys(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	for key, state := range map[string]string{
		"paid": "finished", "paying": "leased", "stuck-1": "runnable", "stuck-2": "runnable", "fresh": "runnable",
		"dead-1": "dead", "dead-2": "dead", "unknown-1": "unknown",
	} {
		keyIn(t, db, "acme", key, state)
	}
	age(t, db, "acme", "stuck-1", "last_run_at = now() - interval '10 minutes'")
	age(t, db, "acme", "stuck-2", "last_run_at = now() - interval '5 minutes'")
	age(t, db, "acme", "dead-2", "last_run_at = now() - interval '1 hour'")

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-stuck"}, []string{"stuck-1", "stuck-2"}},
		{[]string{"--stuck", "--stuck-after", "7m"}, []string{"stuck-1"}},
		{[]string{"-stuck", "-stuck-after=0s"}, []string{"stuck-1", "stuck-2", "fresh"}},
		{[]string{"-dead"}, []string{"dead-2", "dead-1"}},
		{[]string{"-dead", "-limit", "1"}, []string{"dead-2"}},
		{[]string{"-unknown"}, []string{"unknown-1"}},
	} {
		page := decode[keyrow.Page](t, ok(t, dsn, append([]string{"list", "-json"}, tc.args...)...))
		var got []string
		for _, k := range page.Keys {
			got = append(got, k.Key)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("list -json %q = %q, want %q", tc.args, got, tc.want)
		}

		text := ok(t, dsn, append([]string{"list"}, tc.args...)...)
		lines := strings.Split(strings.TrimSpace(text), "\n")
		if !strings.HasPrefix(lines[0], "TENANT  KEY") {
			t.Fatalf("list %q has no header:\n%s", tc.args, text)
		}
		for i, key := range tc.want {
			if fields := strings.Fields(lines[1+i]); fields[0] != "acme" || fields[1] != key {
				t.Errorf("list %q line %d = %q, want acme %s", tc.args, 1+i, lines[1+i], key)
			}
		}
	}
	if out := ok(t, dsn, "list", "-dead"); !strings.Contains(out, "card declined") || !strings.Contains(out, "charged") {
		t.Errorf("list -dead does not show the recovery point and last error:\n%s", out)
	}
	// A finished key is not idle; its IDLE column says so.
	age(t, db, "acme", "paid", "last_run_at = now() - interval '2 minutes'")
	finished := ok(t, dsn, "list", "-state", "finished")
	if lines := strings.Split(strings.TrimSpace(finished), "\n"); len(lines) != 2 || !slices.Equal(strings.Fields(lines[1])[:6], []string{"acme", "paid", "wf", "finished", "1", "-"}) {
		t.Errorf("list -state finished; want the finished key, not idle:\n%s", finished)
	}
	out := ok(t, dsn, "list", "-dead", "-limit", "1")
	_, cursor, found := strings.Cut(strings.TrimSpace(out), "pass -after ")
	if !found {
		t.Fatalf("a page with more after it does not say how to get them:\n%s", out)
	}
	cursor, _, _ = strings.Cut(cursor, " ")
	if out := ok(t, dsn, "list", "-dead", "-limit", "1", "-after", cursor); !strings.Contains(out, "dead-1") || strings.Contains(out, "-after") {
		t.Errorf("the second and last page:\n%s", out)
	}
	if out := ok(t, dsn, "list", "-stuck", "-stuck-after", "1h"); out != "no stuck keys idle for more than 1h0m0s\n" {
		t.Errorf("empty list = %q", out)
	}
	if page := decode[keyrow.Page](t, ok(t, dsn, "list", "-stuck", "-stuck-after", "1h", "-json")); page.Keys == nil || len(page.Keys) != 0 || page.Next != "" {
		t.Errorf("empty list -json = %+v, want no keys and no next page", page)
	}
	if out := ok(t, dsn, "list", "-tenant", "acme", "-key-prefix", "dead-", "-json"); len(decode[keyrow.Page](t, out).Keys) != 2 {
		t.Errorf("list -tenant acme -key-prefix dead- = %s, want the two dead keys", out)
	}
}

func TestListShowsClientControlledTextQuoted(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "evil\x1b[2Jkey\tx", "dead")
	keyIn(t, db, "acme", " sp ", "dead")
	out := ok(t, dsn, "list", "-dead")
	if strings.Contains(out, "\x1b") || !strings.Contains(out, `"evil\x1b[2Jkey\tx"`) {
		t.Fatalf("list printed a raw escape sequence:\n%q", out)
	}
	if !strings.Contains(out, `" sp "`) {
		t.Fatalf("list printed a key with spaces at its ends unquoted:\n%q", out)
	}
}

func TestUnlockFreesALeaseSoTheNextRequestResumes(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "order-1", "leased")
	if out, _ := acquire(t, db, "acme", "order-1"); out != store.Held {
		t.Fatalf("acquire during the lease = %v, want held", out)
	}

	out := ok(t, dsn, "unlock", "acme", "order-1")
	if !strings.Contains(out, "freed the lease") || !strings.Contains(out, "fenced out") {
		t.Fatalf("unlock output:\n%s", out)
	}
	if out, row := acquire(t, db, "acme", "order-1"); out != store.Resumed || row.RecoveryPoint != keyrow.Started {
		t.Fatalf("acquire after unlock = %v at %q, want resumed", out, row.RecoveryPoint)
	}

	keyIn(t, db, "acme", "order-2", "runnable")
	got := decode[map[string]any](t, ok(t, dsn, "unlock", "-json", "acme", "order-2"))
	if got["unlocked"] != false || got["key"] != "order-2" {
		t.Fatalf("unlock -json of a free key = %v, want unlocked false", got)
	}
	if out := ok(t, dsn, "unlock", "acme", "order-2"); !strings.Contains(out, "had no lease; nothing changed") {
		t.Fatalf("unlock of a free key:\n%s", out)
	}
}

func TestRetryMakesADeadKeyClaimableWithAFreshFailureBudget(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	row := keyIn(t, db, "acme", "order-1", "dead")
	age(t, db, "acme", "order-1", "failures = 10")

	got := decode[map[string]any](t, ok(t, dsn, "retry", "-json", "acme", "order-1"))
	if got["previous_hold"] != "dead" || got["recovery_point"] != "charged" {
		t.Fatalf("retry -json = %v", got)
	}
	if info := stored(t, db, "acme", "order-1"); info.Hold != "" || info.Failures != 0 {
		t.Fatalf("after retry: hold %q, failures %d; want runnable with none", info.Hold, info.Failures)
	}
	// With ten failures left on it, an hour's backoff would keep the
	// completer off the key.
	claimed, err := store.Claim(context.Background(), db, store.ClaimParams{
		Workflows: []string{"wf"}, Limit: 10, Backoff: time.Hour, MaxBackoff: time.Hour, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 1 || claimed[0].ID != row.ID || claimed[0].RecoveryPoint != "charged" {
		t.Fatalf("claim after retry = %+v, want the key at charged", claimed)
	}
}

// TestAuditCallsALeaseLeasedOnlyWhileItRuns: the audit's summary of a
// key before and after an action says "leased" for a lease that had not
// run out, as inspect does, and not for one whose expiry is stored but
// past (a run that died and was never given back).
func TestAuditCallsALeaseLeasedOnlyWhileItRuns(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "live", "leased")
	ok(t, dsn, "unlock", "acme", "live")
	keyIn(t, db, "acme", "ran-out", "dead")
	age(t, db, "acme", "ran-out", "lock_token = '"+uuid.NewString()+"', locked_at = now() - interval '2 minutes', lock_expires_at = now() - interval '1 minute'")
	ok(t, dsn, "retry", "acme", "ran-out")
	lines := map[string]string{}
	for line := range strings.Lines(ok(t, dsn, "audit")) {
		for _, key := range []string{"live", "ran-out"} {
			if strings.Contains(line, " "+key+" ") {
				lines[key] = strings.Join(strings.Fields(line), " ")
			}
		}
	}
	if !strings.Contains(lines["live"], "started,leased started") {
		t.Errorf("audit of the unlock: %q; want it leased before, free after", lines["live"])
	}
	if !strings.Contains(lines["ran-out"], "charged,dead charged") || strings.Contains(lines["ran-out"], "leased") {
		t.Errorf("audit of the retry: %q; want dead and not leased before, runnable after", lines["ran-out"])
	}
}

// TestHoldStopsAKeyUntilRetried: hold parks an unfinished key as dead,
// clearing its lease, so that nothing runs it until retry.
func TestHoldStopsAKeyUntilRetried(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "order-1", "leased")
	out := ok(t, dsn, "hold", "acme", "order-1")
	if !strings.Contains(out, "is on hold as dead at recovery point started") || !strings.Contains(out, "fenced out") {
		t.Fatalf("hold output:\n%s", out)
	}
	if info := stored(t, db, "acme", "order-1"); info.Hold != keyrow.HoldDead || info.LeaseTakenAt != nil {
		t.Fatalf("after hold: hold %q, lease %v; want dead with no lease", info.Hold, info.LeaseTakenAt)
	}
	if out, _ := acquire(t, db, "acme", "order-1"); out != store.Parked {
		t.Fatalf("acquire of a held key = %v, want parked", out)
	}
	if r := runCLI(t, dsn, "hold", "acme", "order-1"); r.code != exitError || !strings.Contains(r.stderr, "is dead; only an unfinished key off hold can be held") {
		t.Fatalf("hold of a held key = %d:\n%s", r.code, r.stderr)
	}
	if r := runCLI(t, dsn, "hold", "acme", "missing"); r.code != exitNotFound {
		t.Fatalf("hold of a missing key = %d:\n%s", r.code, r.stderr)
	}
	keyIn(t, db, "acme", "order-2", "runnable")
	got := decode[map[string]any](t, ok(t, dsn, "hold", "-json", "acme", "order-2"))
	if got["key"] != "order-2" || got["recovery_point"] != "charged" || got["lease_cleared"] != false {
		t.Fatalf("hold -json = %v", got)
	}
	held, refused := 0, 0
	for _, e := range decode[[]keyrow.AuditEntry](t, ok(t, dsn, "audit", "-json")) {
		switch {
		case e.Action != keyrow.ActionHold || e.Tenant != "acme":
		case e.Refused != "" && e.Key == "order-1":
			refused++
		case e.Key == "order-1" || e.Key == "order-2":
			held++
		}
	}
	// The hold of a key already held is refused and audited as such.
	if held != 2 || refused != 1 {
		t.Fatalf("audit -json has %d holds of the two keys and %d refused, want 2 and 1", held, refused)
	}
	ok(t, dsn, "retry", "acme", "order-1")
	if out, _ := acquire(t, db, "acme", "order-1"); out != store.Resumed {
		t.Fatalf("acquire after retry = %v, want resumed", out)
	}
}

func TestRetryOfAnUnknownKeyNeedsConfirmation(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "order-1", "unknown")

	r := runCLI(t, dsn, "retry", "acme", "order-1")
	if r.code != exitUsage || !strings.Contains(r.stderr, "pass -confirm-unknown") {
		t.Fatalf("retry of an unknown key = %d:\n%s", r.code, r.stderr)
	}
	if hold := stored(t, db, "acme", "order-1").Hold; hold != keyrow.HoldUnknown {
		t.Fatalf("refused retry changed the hold to %q", hold)
	}

	out := ok(t, dsn, "retry", "-confirm-unknown", "acme", "order-1")
	if !strings.Contains(out, "was unknown and is off hold, waiting") {
		t.Fatalf("retry -confirm-unknown output:\n%s", out)
	}
	if out, _ := acquire(t, db, "acme", "order-1"); out != store.Resumed {
		t.Fatalf("acquire after retry = %v, want resumed", out)
	}
}

func TestRetryOfAKeyNotOnHoldExitsOne(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "order-1", "finished")
	r := runCLI(t, dsn, "retry", "acme", "order-1")
	if r.code != exitError || !strings.Contains(r.stderr, "is finished, not on hold") {
		t.Fatalf("retry of a finished key = %d:\n%s", r.code, r.stderr)
	}
	// The refusal is audited, as one the store makes is.
	entries := decode[[]keyrow.AuditEntry](t, ok(t, dsn, "audit", "-json"))
	if len(entries) != 1 || entries[0].Action != keyrow.ActionRetry || entries[0].Refused == "" {
		t.Fatalf("audit after a refused retry: %+v, want one refused retry", entries)
	}
}

func TestReapDryRunChangesNothingAndPredictsTheRealRun(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	for key, state := range map[string]string{
		"paid-old": "finished", "paid-older": "finished", "paid-new": "finished",
		"dead-old": "dead", "runnable-old": "runnable", "unknown-old": "unknown", "leased-old": "leased",
	} {
		keyIn(t, db, "acme", key, state)
	}
	age(t, db, "acme", "paid-old", "finished_at = now() - interval '25 hours'")
	age(t, db, "acme", "paid-older", "finished_at = now() - interval '3 days'")
	for _, key := range []string{"dead-old", "runnable-old", "unknown-old", "leased-old"} {
		age(t, db, "acme", key, "last_run_at = now() - interval '2 days'")
	}
	before := decode[keyrow.Counts](t, ok(t, dsn, "counts", "-json"))

	dry := decode[reapReport](t, ok(t, dsn, "reap", "-dry-run", "-json"))
	if !dry.DryRun || dry.Reaped != 2 || dry.Abandoned != 2 || dry.Retention != "24h0m0s" {
		t.Fatalf("reap -dry-run = %+v, want 2 to reap and 2 to answer", dry)
	}
	if text := ok(t, dsn, "reap", "--dry-run"); !strings.Contains(text, "nothing was changed") ||
		!strings.Contains(text, "finished keys to reap     2") {
		t.Fatalf("reap -dry-run text:\n%s", text)
	}
	if after := decode[keyrow.Counts](t, ok(t, dsn, "counts", "-json")); after != before {
		t.Fatalf("dry run changed the counts from %+v to %+v", before, after)
	}

	real := decode[reapReport](t, ok(t, dsn, "reap", "-json", "-batch", "1"))
	if real.DryRun || real.Reaped != dry.Reaped || real.Abandoned != dry.Abandoned {
		t.Fatalf("reap = %+v, dry run predicted %+v", real, dry)
	}
	for _, key := range []string{"paid-old", "paid-older"} {
		if _, err := store.Inspect(context.Background(), db, "acme", key); !errors.Is(err, keyrow.ErrNotFound) {
			t.Errorf("%s survived the reap: %v", key, err)
		}
	}
	if info := stored(t, db, "acme", "dead-old"); info.RecoveryPoint != keyrow.Finished || *info.ResponseStatus != 500 {
		t.Errorf("abandoned key after reap: %s %v, want finished with a 500", info.RecoveryPoint, info.ResponseStatus)
	}
	for _, key := range []string{"paid-new", "unknown-old", "leased-old"} {
		stored(t, db, "acme", key)
	}
}

func TestStatsCountsEveryKeyInExactlyOneState(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	for key, state := range map[string]string{
		"paid": "finished", "paying": "leased", "declined": "runnable", "stuck": "runnable",
		"dead": "dead", "unknown": "unknown",
	} {
		keyIn(t, db, "acme", key, state)
	}
	age(t, db, "acme", "stuck", "last_run_at = now() - interval '2 minutes'")
	age(t, db, "acme", "declined", "definition = 'next'")
	var rows int
	if err := db.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_keys").Scan(&rows); err != nil {
		t.Fatal(err)
	}

	got := decode[countsReport](t, ok(t, dsn, "counts", "-json"))
	want := keyrow.Counts{Finished: 1, InFlight: 1, Waiting: 1, Stuck: 1, Unknown: 1, Dead: 1}
	if got.Counts != want || got.Total != rows {
		t.Fatalf("counts -json = %+v, want %+v and a total of %d", got, want, rows)
	}
	// The unfinished keys by definition: four stored before definitions
	// (two of them on hold), one under the next.
	if d := got.Definitions; len(d) != 2 || d[0].Definition != "" || d[0].Unfinished != 4 || d[0].Held != 2 ||
		d[1].Definition != "next" || d[1].Unfinished != 1 || d[1].Held != 0 {
		t.Fatalf("counts -json definitions = %+v", d)
	}
	for _, tc := range []struct {
		stuckAfter     string
		waiting, stuck int
	}{{"5m", 2, 0}, {"0s", 0, 2}} {
		got := decode[countsReport](t, ok(t, dsn, "counts", "-json", "-stuck-after", tc.stuckAfter))
		if got.Waiting != tc.waiting || got.Stuck != tc.stuck || got.Total != rows {
			t.Errorf("stats -stuck-after %s = %+v, want %d waiting, %d stuck, %d in all",
				tc.stuckAfter, got, tc.waiting, tc.stuck, rows)
		}
	}
	text := ok(t, dsn, "counts")
	for _, want := range []string{"finished   1", "in flight  1", "waiting    1  idle for at most 1m0s",
		"stuck      1  idle for more than 1m0s", "unknown    1", "dead       1", "total      6",
		"unfinished keys by workflow definition:", "next        1           0"} {
		if !strings.Contains(text, want) {
			t.Errorf("stats output lacks %q:\n%s", want, text)
		}
	}
}

func TestCountsShowTheBacklogAndHowFastItDrains(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	for i := range 10 {
		key := fmt.Sprintf("stuck-%d", i)
		keyIn(t, db, "acme", key, "runnable")
		age(t, db, "acme", key, "last_run_at = now() - interval '2 minutes'")
	}
	keyIn(t, db, "acme", "waiting", "runnable")
	age(t, db, "acme", "waiting", "last_run_at = now() - interval '30 seconds'")
	// Before any count was taken the rate is unknown. The waiting key
	// comes due once idle for a minute, in 30 seconds.
	got := decode[countsReport](t, ok(t, dsn, "counts", "-json")).Backlog
	if got.NotDue != 1 || got.FirstDue != got.LastDue || got.LastDue <= 25*time.Second || got.LastDue > 30*time.Second {
		t.Errorf("counts -json backlog = %+v, want 1 key due in 30 seconds", got)
	}
	got.NotDue, got.FirstDue, got.LastDue = 0, 0, 0
	if got != (phase.Backlog{Stuck: 10, Waiting: 1, Unfinished: 11}) {
		t.Errorf("counts -json backlog with no count taken = %+v, want 10 stuck and 1 waiting, rate not measured", got)
	}
	if text := ok(t, dsn, "counts"); !regexp.MustCompile(`backlog    11  keys stuck or waiting, drain rate unknown: .*; 1 come due in \d\ds`).MatchString(text) {
		t.Errorf("counts with no count taken lacks the unknown rate and the key due:\n%s", text)
	}
	// The completers counted 400 keys 20 seconds ago: the rate runs from
	// there to the 11 now; a count younger than DrainSpan, and one past the
	// window, count for nothing.
	if _, err := db.Exec(context.Background(), `
INSERT INTO atomicphase_backlog_samples (slot, at, keys)
SELECT to_timestamp(floor(extract(epoch FROM now() - ago) / 5) * 5), now() - ago, keys
FROM (VALUES (interval '20 seconds', 400), (interval '3 seconds', 20), (interval '10 minutes', 90000)) AS s(ago, keys)`); err != nil {
		t.Fatal(err)
	}
	got = decode[countsReport](t, ok(t, dsn, "counts", "-json")).Backlog
	if !got.Measured || got.Stuck != 10 || got.Waiting != 1 || got.Unfinished != 11 || got.Over < 20*time.Second ||
		got.Over > 25*time.Second || got.PerSecond != 389/got.Over.Seconds() {
		t.Errorf("counts -json backlog = %+v, want 10 stuck, 1 waiting, 389 drained since 20 seconds ago", got)
	}
	// The 11 keys drain in about a second at that rate, but the waiting
	// one comes due later: "empty in about" is when it does.
	want := regexp.MustCompile(`backlog    11  keys stuck or waiting, draining \d+\.\d a second over the last 2\ds, empty in about (\d\ds); 1 come due in (\d\ds)`)
	text := ok(t, dsn, "counts")
	if m := want.FindStringSubmatch(text); m == nil || m[1] != m[2] {
		t.Errorf("counts lacks a line like %q, empty when the key comes due:\n%s", want, text)
	}
}

func TestMigrateAppliesThePendingMigrationsAndCanRunAgain(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	// The test database is migrated already; an empty schema first on the
	// search path gets a schema of its own.
	if _, err := db.Exec(context.Background(), "CREATE SCHEMA fresh"); err != nil {
		t.Fatal(err)
	}
	fresh := withSearchPath(t, dsn, "fresh")
	all := atomicphase.Migrations()
	latest := len(all)

	st := decode[migrateStatus](t, ok(t, fresh, "migrate", "-status", "-json"))
	if st.Version != 0 || st.Latest != latest || len(st.Pending) != latest || st.Pending[0].Name != all[0].Name {
		t.Fatalf("migrate -status -json before migrating = %+v", st)
	}
	if out := ok(t, fresh, "migrate", "-status"); !strings.Contains(out, "version  0\n") ||
		!strings.Contains(out, "pending  001_create_idempotency_keys\n") {
		t.Fatalf("migrate -status before migrating:\n%s", out)
	}

	out := ok(t, fresh, "migrate")
	if !strings.HasPrefix(out, fmt.Sprintf("migrated the schema from version 0 to %d:\n  001_create_idempotency_keys\n", latest)) {
		t.Fatalf("migrate output = %q", out)
	}
	var table *string
	if err := db.QueryRow(context.Background(), "SELECT to_regclass('fresh.idempotency_keys')::text").Scan(&table); err != nil || table == nil {
		t.Fatalf("migrate did not create fresh.idempotency_keys: %v", err)
	}

	again := decode[migrateReport](t, ok(t, fresh, "migrate", "-json"))
	if again.PreviousVersion != latest || again.Version != latest || len(again.Applied) != 0 {
		t.Fatalf("migrate -json of a migrated database = %+v, want nothing applied", again)
	}
	if out := ok(t, fresh, "migrate"); out != fmt.Sprintf("the schema is up to date at version %d\n", latest) {
		t.Fatalf("migrate of a migrated database = %q", out)
	}
	if out := ok(t, fresh, "migrate", "-status"); !strings.Contains(out, "pending  none\n") {
		t.Fatalf("migrate -status after migrating:\n%s", out)
	}
}

func TestMigrateRefusesADatabaseANewerReleaseMigrated(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	newer := len(atomicphase.Migrations()) + 1
	if _, err := db.Exec(context.Background(), "INSERT INTO atomicphase_migration (version, name) VALUES ($1, 'from_the_future')", newer); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, dsn, "migrate")
	if r.code != exitError || !strings.Contains(r.stderr, "newer than this release") || r.stdout != "" {
		t.Fatalf("migrate of a newer database = %d, stdout %q, stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	st := decode[migrateStatus](t, ok(t, dsn, "migrate", "-status", "-json"))
	if st.Version != newer || len(st.Pending) != 0 {
		t.Fatalf("migrate -status -json of a newer database = %+v", st)
	}
	if out := ok(t, dsn, "migrate", "-status"); !strings.Contains(out, "the database is newer than this release") {
		t.Fatalf("migrate -status of a newer database:\n%s", out)
	}
}

func TestMigratePrintWritesTheSQLWithoutADatabase(t *testing.T) {
	t.Parallel()
	all := atomicphase.Migrations()
	// Neither URL is connected to: one is unset, the other unreachable.
	for _, env := range []string{"", unreachable} {
		out := ok(t, env, "migrate", "-print")
		for _, m := range all {
			if !strings.Contains(out, fmt.Sprintf("-- %03d_%s.up.sql\n%s", m.Version, m.Name, m.SQL)) {
				t.Errorf("migrate -print lacks migration %d", m.Version)
			}
		}
	}
	printed := decode[[]migrationJSON](t, ok(t, "", "migrate", "-print", "-json"))
	if len(printed) != len(all) || printed[0].Version != 1 || printed[0].SQL != all[0].SQL {
		t.Fatalf("migrate -print -json = %d migrations, want %d with their SQL", len(printed), len(all))
	}
	if out := ok(t, "", "migrate", "-print", "-from", strconv.Itoa(len(all))); out != "" {
		t.Fatalf("migrate -print -from the latest version = %q, want nothing", out)
	}
	if r := runCLI(t, "", "migrate", "-print", "-from", strconv.Itoa(len(all)+1)); r.code != exitError ||
		!strings.Contains(r.stderr, "newer than this release knows") {
		t.Fatalf("migrate -print -from a version after the latest = %d:\n%s", r.code, r.stderr)
	}

	// The printed script builds the schema, as another tool would apply it.
	dsn, db := setup(t)
	if _, err := db.Exec(context.Background(), "CREATE SCHEMA printed"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), withSearchPath(t, dsn, "printed"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), ok(t, "", "migrate", "-print")); err != nil {
		t.Fatalf("applying the printed SQL: %v", err)
	}
	var table *string
	if err := conn.QueryRow(context.Background(), "SELECT to_regclass('printed.idempotency_keys')::text").Scan(&table); err != nil || table == nil {
		t.Fatalf("the printed SQL did not create printed.idempotency_keys: %v", err)
	}
}

func TestSchemaFlagNamesTheSchemaThatHoldsTheTables(t *testing.T) {
	t.Parallel()
	// The search_path of this database finds no table of the library.
	db := pgtest.SchemaPool(t)
	dsn := db.Config().ConnString()
	latest := len(atomicphase.Migrations())
	if out := ok(t, dsn, "migrate", "-schema", "payments"); !strings.HasPrefix(out, fmt.Sprintf("migrated the schema from version 0 to %d:\n", latest)) {
		t.Fatalf("migrate -schema payments = %q", out)
	}
	if st := decode[migrateStatus](t, ok(t, dsn, "migrate", "-status", "-json", "-schema", "payments")); st.Version != latest {
		t.Fatalf("migrate -status -schema payments = %+v", st)
	}
	s, err := store.NewSchema("payments")
	if err != nil {
		t.Fatal(err)
	}
	keyIn(t, s.Querier(db), "acme", "order-1", "leased")
	if out := ok(t, dsn, "unlock", "-schema", "payments", "acme", "order-1"); !strings.Contains(out, "freed the lease") {
		t.Fatalf("unlock -schema payments:\n%s", out)
	}
	info := decode[keyrow.Row](t, ok(t, dsn, "inspect", "-json", "-schema", "payments", "acme", "order-1"))
	if info.Key != "order-1" || info.LeaseExpiresAt != nil {
		t.Fatalf("inspect -schema payments = %+v, want the key unlocked", info)
	}
	if r := runCLI(t, dsn, "inspect", "acme", "order-1"); r.code != exitError || !strings.Contains(r.stderr, "-schema") {
		t.Fatalf("inspect without -schema = %d:\n%s", r.code, r.stderr)
	}
	if r := runCLI(t, dsn, "inspect", "-schema", "pg_keys", "acme", "order-1"); r.code != exitUsage || !strings.Contains(r.stderr, "-schema") {
		t.Fatalf("inspect -schema pg_keys = %d:\n%s", r.code, r.stderr)
	}
	printed := ok(t, "", "migrate", "-print", "-schema", "payments")
	if !strings.Contains(printed, "CREATE SCHEMA IF NOT EXISTS \"payments\";\n") ||
		!strings.Contains(printed, "CREATE TABLE IF NOT EXISTS \"payments\".idempotency_keys") {
		t.Fatalf("migrate -print -schema payments names no schema:\n%s", printed)
	}
}

// withSearchPath returns dsn, in either DSN form, with its search_path set.
func withSearchPath(t *testing.T, dsn, schema string) string {
	t.Helper()
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " search_path=" + schema
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal("cannot parse the test DSN")
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestStatsListAndUnlockThroughPgBouncer(t *testing.T) {
	t.Parallel()
	db := pgtest.BouncerPool(t)
	for key, state := range map[string]string{"paid": "finished", "paying": "leased", "stuck": "runnable", "dead": "dead"} {
		keyIn(t, db, "acme", key, state)
	}
	age(t, db, "acme", "stuck", "last_run_at = now() - interval '10 minutes'")
	bouncer := db.Config().ConnConfig.ConnString()

	// pgx's default query exec mode prepares statements on server sessions,
	// which the bouncer hands from transaction to transaction.
	r := runCLI(t, bouncer, "counts")
	if r.code != exitError || !strings.Contains(r.stderr, "default_query_exec_mode=cache_describe") {
		t.Fatalf("stats through the bouncer in the default mode = %d, stderr:\n%s\nwant 1 saying which mode to set", r.code, r.stderr)
	}

	dsn := bouncer + " default_query_exec_mode=cache_describe"
	got := decode[countsReport](t, ok(t, dsn, "counts", "-json"))
	if want := (keyrow.Counts{Finished: 1, InFlight: 1, Stuck: 1, Dead: 1}); got.Counts != want {
		t.Errorf("counts -json = %+v, want %+v", got.Counts, want)
	}
	for _, tc := range []struct{ flag, key string }{{"-stuck", "stuck"}, {"-dead", "dead"}} {
		keys := decode[keyrow.Page](t, ok(t, dsn, "list", "-json", tc.flag)).Keys
		if len(keys) != 1 || keys[0].Key != tc.key {
			t.Errorf("list %s = %+v, want key %s alone", tc.flag, keys, tc.key)
		}
	}
	if out := ok(t, dsn, "unlock", "acme", "paying"); !strings.Contains(out, "freed the lease") {
		t.Fatalf("unlock output:\n%s", out)
	}
	if out, row := acquire(t, db, "acme", "paying"); out != store.Resumed {
		t.Fatalf("acquire after unlock through the bouncer = %v at %q, want resumed", out, row.RecoveryPoint)
	}
}

func TestResolveRecordsTheResolutionAndAuditsItUnderTheActor(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "order-1", "unknown")

	r := runCLI(t, dsn, "resolve", "-at", keyrow.Started, "-not-happened", "acme", "order-1")
	if r.code != exitError || !strings.Contains(r.stderr, "not held as unknown at recovery point") {
		t.Fatalf("resolve at a point the key left = %d:\n%s", r.code, r.stderr)
	}
	if r := runCLI(t, dsn, "resolve", "-at", "charged", "-not-happened", "acme", "missing"); r.code != exitNotFound {
		t.Fatalf("resolve of a missing key = %d, want %d", r.code, exitNotFound)
	}
	out := ok(t, dsn, "resolve", "-actor", "alice", "-at", "charged", "-happened", "-output", `{"id":"ch_7"}`, "acme", "order-1")
	if !strings.Contains(out, "happened") {
		t.Fatalf("resolve output:\n%s", out)
	}
	if res := stored(t, db, "acme", "order-1").Resolution; res == nil || !res.Happened || string(res.Output) != `{"id": "ch_7"}` {
		t.Fatalf("stored resolution = %+v", res)
	}
	entries := decode[[]keyrow.AuditEntry](t, ok(t, dsn, "audit", "-json"))
	if len(entries) != 2 || entries[0].Actor != "alice" || entries[0].Action != keyrow.ActionResolve || entries[0].Key != "order-1" ||
		entries[0].Refused != "" || entries[1].Refused == "" {
		t.Fatalf("audit = %+v, want the refused resolution, then alice's", entries)
	}
	if out := ok(t, dsn, "audit"); !strings.Contains(out, "alice") || !strings.Contains(out, "resolved:happened") {
		t.Fatalf("audit text:\n%s", out)
	}
}

func TestBulkRetryCountsFirstAndActsOnlyWithYes(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	for _, key := range []string{"dead-1", "dead-2"} {
		keyIn(t, db, "acme", key, "dead")
	}
	keyIn(t, db, "acme", "unknown-1", "unknown")

	if out := ok(t, dsn, "bulk", "-retry", "-tenant", "acme"); !strings.Contains(out, "2 keys would change; pass -yes") {
		t.Fatalf("bulk preview:\n%s", out)
	}
	if hold := stored(t, db, "acme", "dead-1").Hold; hold != keyrow.HoldDead {
		t.Fatalf("the preview changed a key's hold to %q", hold)
	}
	got := decode[bulkReport](t, ok(t, dsn, "bulk", "-json", "-retry", "-yes", "-confirm-unknown", "-tenant", "acme"))
	if !got.Applied || got.Keys != 3 {
		t.Fatalf("bulk -retry -yes -confirm-unknown = %+v, want 3 keys changed", got)
	}
	for _, key := range []string{"dead-1", "dead-2", "unknown-1"} {
		if hold := stored(t, db, "acme", key).Hold; hold != "" {
			t.Errorf("%s: hold %q after bulk retry", key, hold)
		}
	}
}

func TestActionsGivenWhatInspectShowedRefuseAKeyThatChangedAndExitFour(t *testing.T) {
	t.Parallel()
	dsn, db := setup(t)
	keyIn(t, db, "acme", "order-1", "unknown")
	var shown struct {
		Seen string `json:"seen"`
	}
	shown = decode[struct {
		Seen string `json:"seen"`
	}](t, ok(t, dsn, "inspect", "-json", "acme", "order-1"))
	if text := ok(t, dsn, "inspect", "acme", "order-1"); shown.Seen == "" || !strings.Contains(text, shown.Seen) {
		t.Fatalf("inspect shows no token to pass as -seen (json %q):\n%s", shown.Seen, text)
	}

	ok(t, dsn, "resolve", "-actor", "alice", "-seen", shown.Seen, "-at", "charged", "-happened", "-output", `{"id":"ch_7"}`, "acme", "order-1")
	for _, args := range [][]string{
		{"resolve", "-actor", "bob", "-seen", shown.Seen, "-at", "charged", "-not-happened", "acme", "order-1"},
		{"resolve", "-actor", "bob", "-at", "charged", "-not-happened", "acme", "order-1"},
		{"retry", "-actor", "bob", "-seen", shown.Seen, "-confirm-unknown", "acme", "order-1"},
		{"retry", "-actor", "bob", "-confirm-unknown", "acme", "order-1"},
		{"unlock", "-actor", "bob", "-seen", shown.Seen, "acme", "order-1"},
	} {
		r := runCLI(t, dsn, args...)
		if r.code != exitChanged || !strings.Contains(r.stderr, "nothing changed") || !strings.Contains(r.stderr, "ch_7") {
			t.Errorf("%q = %d; want %d saying the resolution recorded since:\n%s", args, r.code, exitChanged, r.stderr)
		}
	}
	if res := stored(t, db, "acme", "order-1"); res.Hold != keyrow.HoldUnknown || res.Resolution == nil || !res.Resolution.Happened {
		t.Fatalf("after the refusals: hold %q, resolution %s; want alice's resolution kept", res.Hold, res.Resolution)
	}
	if out := ok(t, dsn, "audit"); strings.Count(out, "(refused: ") != 5 {
		t.Fatalf("audit shows %d refusals, want 5:\n%s", strings.Count(out, "(refused: "), out)
	}
	if r := runCLI(t, dsn, "unlock", "-seen", "not-a-token", "acme", "order-1"); r.code != exitUsage {
		t.Fatalf("unlock with a bad token = %d, want %d", r.code, exitUsage)
	}

	// A lease taken after inspect showed the key expired is left alone.
	keyIn(t, db, "acme", "order-2", "leased")
	age(t, db, "acme", "order-2", `lock_expires_at = now() - interval '1 minute'`)
	expired := decode[struct {
		Seen string `json:"seen"`
	}](t, ok(t, dsn, "inspect", "-json", "acme", "order-2")).Seen
	if out, _ := acquire(t, db, "acme", "order-2"); out != store.Resumed {
		t.Fatalf("a new run's acquire = %v, want resumed", out)
	}
	if r := runCLI(t, dsn, "unlock", "-seen", expired, "acme", "order-2"); r.code != exitChanged || !strings.Contains(r.stderr, "took the lease again") {
		t.Fatalf("unlock of the expired lease seen = %d:\n%s", r.code, r.stderr)
	}
	if row := stored(t, db, "acme", "order-2"); row.LeaseLeft == 0 {
		t.Fatal("the stale unlock freed the new run's lease")
	}
}
