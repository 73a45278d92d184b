package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// addr is where the quick start listens.
const addr = "localhost:8080"

// build compiles the quick start into the test's temporary directory.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The quick start exits 1 when its port is taken, at once and before it
// needs a database, so that a script waiting for it stops waiting.
func TestQuickStartExitsOneWhenItCannotListen(t *testing.T) {
	bin := build(t)
	if ln, err := net.Listen("tcp", addr); err == nil { // else something else holds it, which does as well
		defer ln.Close()
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://nobody@127.0.0.1:1/none?connect_timeout=30")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "address already in use") {
		t.Fatalf("quick start with %s taken: %v, want exit status 1 naming the address in use:\n%s", addr, err, out)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("it took %v to give up, want it at once, before any database", took)
	}
}

// The quick start stops on SIGTERM, as kill sends it: it stops serving,
// stops its client, and exits 0, leaving no key leased.
func TestQuickStartStopsOnSIGTERM(t *testing.T) {
	bin := build(t)
	if ln, err := net.Listen("tcp", addr); err != nil {
		t.Skipf("%s is taken: %v", addr, err)
	} else {
		ln.Close()
	}
	dsn := pgtest.DSN(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })

	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr, strings.NewReader(`{"Item":"lamp"}`))
		req.Header.Set("Authorization", "acme")
		req.Header.Set("Idempotency-Key", "k1")
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
			if res.StatusCode != http.StatusCreated {
				t.Fatalf("POST: %s, want 201", res.Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the quick start did not serve: %v\n%s", err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil || !strings.Contains(out.String(), "stopped") {
			t.Fatalf("after SIGTERM: %v, want exit status 0 after \"stopped\":\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the quick start still runs 30 s after SIGTERM:\n%s", out.String())
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var keys, leased int
	if err := conn.QueryRow(context.Background(),
		`SELECT count(*), count(lock_token) FROM idempotency_keys`).Scan(&keys, &leased); err != nil {
		t.Fatal(err)
	}
	if keys != 1 || leased != 0 {
		t.Errorf("%d keys, %d of them leased; want the one key, not leased", keys, leased)
	}
}

// The README's quick start commands, run by bash as pasted, against a
// Postgres found as libpq finds one (PGHOST, PGPORT, PGUSER): createdb
// makes the database, the server is built, waited for and answers 201, the
// same 201 replayed, and 422. The one change to the text: go build writes
// into the test's temporary directory instead of bin/ in the checkout.
func TestReadmeQuickStartCommandsWork(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash is not installed")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	if _, err := exec.LookPath("createdb"); err != nil {
		t.Skip("createdb is not installed (Debian and Ubuntu: apt-get install postgresql-client)")
	}
	if ln, err := net.Listen("tcp", addr); err != nil {
		t.Skipf("%s is taken: %v", addr, err)
	} else {
		ln.Close()
	}
	script := readmeCommands(t)
	admin := pgtest.Server(t).AdminDSN
	cfg, err := pgconn.ParseConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) }) // after the drop below
	var exists bool
	if err := conn.QueryRow(context.Background(), `SELECT exists (SELECT FROM pg_database WHERE datname = 'quickstart')`).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Skip("the test server already has a database named quickstart, which the commands would reuse")
	}
	t.Cleanup(func() {
		if _, err := conn.Exec(context.Background(), `DROP DATABASE IF EXISTS quickstart WITH (FORCE)`); err != nil {
			t.Error(err)
		}
	})

	binDir := t.TempDir()
	script = strings.ReplaceAll(script, "bin/", binDir+"/")
	cmd := exec.Command(bash, "-c", script)
	cmd.Dir = "../.."
	// The caller's DATABASE_URL and PG* settings must not reach the
	// commands: they find the test server as libpq finds a local one.
	env := slices.DeleteFunc(os.Environ(), func(e string) bool {
		return strings.HasPrefix(e, "DATABASE_URL=") || strings.HasPrefix(e, "PG")
	})
	cmd.Env = append(env, "PGHOST="+cfg.Host, fmt.Sprintf("PGPORT=%d", cfg.Port), "PGUSER="+cfg.User, "PGPASSWORD="+cfg.Password)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the commands failed: %v\n%s", err, out)
	}
	statuses := regexp.MustCompile(`(?m)^HTTP/1\.1 (\d+)`).FindAllStringSubmatch(string(out), -1)
	var got []string
	for _, s := range statuses {
		got = append(got, s[1])
	}
	if strings.Join(got, " ") != "201 201 422" || strings.Count(string(out), "Idempotent-Replayed: true") != 1 {
		t.Fatalf("statuses %v, want 201, a replayed 201 and 422:\n%s", got, out)
	}
	// kill $! at the end stopped the server: the port is free again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			ln.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the quick start still holds %s after kill $!", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readmeCommands returns the shell block of the README's Quick start.
func readmeCommands(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "## Quick start")
	if !ok {
		t.Fatal("README has no Quick start section")
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	if !ok {
		t.Fatal("README's Quick start has no shell block")
	}
	block, _, ok := strings.Cut(rest, "```\n")
	if !ok {
		t.Fatal("README's Quick start shell block is not closed")
	}
	return block
}
