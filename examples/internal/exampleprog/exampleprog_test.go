package exampleprog_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/examples/internal/exampleprog"
	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// greet is a program whose demo command greets -name and whose fail
// command fails.
var greet = exampleprog.Program{
	Name:  "greet",
	Usage: "usage: greet [demo flags] | greet fail\n",
	Commands: map[string]exampleprog.Command{
		"demo": func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			fs := exampleprog.Flags("greet", "greet: say hello.", stderr)
			name := fs.String("name", "world", "whom to greet")
			if err := exampleprog.Parse(fs, args); err != nil {
				return err
			}
			_, err := io.WriteString(stdout, "hello, "+*name+"\n")
			return err
		},
		"fail": func(context.Context, []string, io.Writer, io.Writer) error {
			return errors.New("no greeting today")
		},
	},
}

func TestRunExitsWithTheStatusTheOutcomeCallsFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args              []string
		code              int
		stdout, stderrHas string
	}{
		{nil, 0, "hello, world\n", ""},
		{[]string{"-name", "gopher"}, 0, "hello, gopher\n", ""},
		{[]string{"demo", "-name", "gopher"}, 0, "hello, gopher\n", ""},
		{[]string{"help"}, 0, greet.Usage, ""},
		{[]string{"-h"}, 0, "", "greet: say hello.\n\nFlags:\n  -name string"},
		{[]string{"-nope"}, 2, "", "flag provided but not defined: -nope"},
		{[]string{"demo", "extra"}, 2, "", "unexpected arguments: [extra]"},
		{[]string{"bogus"}, 2, "", `greet: unknown command "bogus"` + "\n\n" + greet.Usage},
		{[]string{"fail"}, 1, "", "greet: no greeting today\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := greet.Run(context.Background(), tc.args, &stdout, &stderr)
		if code != tc.code || stdout.String() != tc.stdout || !strings.Contains(stderr.String(), tc.stderrHas) {
			t.Errorf("greet %q exited %d, want %d\nstdout: %q, want %q\nstderr: %q, want it to hold %q",
				tc.args, code, tc.code, stdout.String(), tc.stdout, stderr.String(), tc.stderrHas)
		}
	}
}

func TestErrorsNameTheProgramOnce(t *testing.T) {
	t.Parallel()
	p := exampleprog.Program{Name: "greet", Commands: map[string]exampleprog.Command{
		"demo": func(context.Context, []string, io.Writer, io.Writer) error {
			return errors.New("greet: migrate: no database")
		},
	}}
	var stderr bytes.Buffer
	if code := p.Run(context.Background(), nil, io.Discard, &stderr); code != 1 || stderr.String() != "greet: migrate: no database\n" {
		t.Errorf("exited %d with %q, want 1 with the program's name said once", code, stderr.String())
	}
}

// Not parallel: it sets the environment.
func TestHelpNeverPrintsSecretDefaults(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://rides:hunter2@db.internal:5432/rides")
	t.Setenv("GREET_API_KEY", "sk_live_s3cr3t")
	define := func(stderr io.Writer) (*flag.FlagSet, *string, *string) {
		fs := exampleprog.Flags("greet", "greet: say hello.", stderr)
		db := exampleprog.DatabaseURL(fs, "Postgres `URL` (default $DATABASE_URL)")
		key := exampleprog.SecretString(fs, "api-key", "GREET_API_KEY", "sk_test_x", "API `key` (default $GREET_API_KEY)")
		return fs, db, key
	}

	var help bytes.Buffer
	fs, _, _ := define(&help)
	if err := exampleprog.Parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, secret := range []string{"hunter2", "sk_live_s3cr3t", "db.internal"} {
		if strings.Contains(help.String(), secret) {
			t.Errorf("-h printed %q:\n%s", secret, help.String())
		}
	}
	if !strings.Contains(help.String(), "-database-url URL") || !strings.Contains(help.String(), "$GREET_API_KEY") {
		t.Errorf("-h does not document the flags:\n%s", help.String())
	}

	fs, db, key := define(io.Discard)
	if err := exampleprog.Parse(fs, nil); err != nil {
		t.Fatal(err)
	}
	if *db != "postgres://rides:hunter2@db.internal:5432/rides" || *key != "sk_live_s3cr3t" {
		t.Errorf("defaults %q, %q, want the environment's", *db, *key)
	}
	fs, db, key = define(io.Discard)
	if err := exampleprog.Parse(fs, []string{"-database-url", "postgres:///x", "-api-key", "sk_test_y"}); err != nil {
		t.Fatal(err)
	}
	if *db != "postgres:///x" || *key != "sk_test_y" {
		t.Errorf("flags gave %q, %q", *db, *key)
	}
	t.Setenv("GREET_API_KEY", "")
	fs, _, key = define(io.Discard)
	if err := exampleprog.Parse(fs, nil); err != nil || *key != "sk_test_x" {
		t.Errorf("without the variable: %q, %v, want the fallback", *key, err)
	}
}

func TestProgressWritesWholeLinesWhenNotOnATerminal(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	stop := exampleprog.Progress(&out, func() string { return "rides 3: 2 created" })
	stop()
	if out.String() != "rides 3: 2 created\n" {
		t.Errorf("progress wrote %q, want one whole line without carriage returns", out.String())
	}
}

// A server that accepts connections and never answers, as a firewall that
// drops packets looks to a client.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return ln.Addr().String()
}

func TestOpenDatabaseSaysWhereAndGivesUpOnASilentServer(t *testing.T) {
	t.Parallel()
	addr := silentServer(t)
	var progress bytes.Buffer
	began := time.Now()
	_, _, err := exampleprog.OpenDatabase(context.Background(), exampleprog.Database{
		URL:      "postgres://rides:hunter2@" + addr + "/rides?connect_timeout=1&sslmode=disable",
		Progress: &progress,
	})
	took := time.Since(began)
	want := "postgres://rides@" + addr + "/rides"
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %v, want one naming %s without the password", err, want)
	}
	if progress.String() != "database: "+want+"\n" {
		t.Errorf("progress %q, want the database named before connecting", progress.String())
	}
	if took > 30*time.Second {
		t.Errorf("gave up after %v, want about connect_timeout", took)
	}
}

// A database that does not exist, on a server reached over TCP where pgx
// first asks for TLS, is reported by the server's answer, without the
// refused TLS attempt before it.
func TestOpenDatabaseReportsTheServersAnswer(t *testing.T) {
	t.Parallel()
	cfg, err := pgconn.ParseConfig(pgtest.Server(t).AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(cfg.User, cfg.Password), Host: pgtest.TCPAddr(t),
		Path: "/no_such_database", RawQuery: "sslmode=prefer&connect_timeout=10"}
	_, _, err = exampleprog.OpenDatabase(context.Background(), exampleprog.Database{URL: u.String()})
	if err == nil || !strings.Contains(err.Error(), `database "no_such_database" does not exist`) || strings.Contains(err.Error(), "TLS") {
		t.Fatalf("error %v, want the server's answer alone", err)
	}
}

func TestOpenDatabaseAnnouncesAThrowawayDatabase(t *testing.T) {
	t.Parallel()
	var progress bytes.Buffer
	pool, closeDB, err := exampleprog.OpenDatabase(context.Background(), exampleprog.Database{Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB()
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"database: postgres://", "THROWAWAY", "DATABASE_URL", "runs the server binaries in /"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress %q does not say %q", progress.String(), want)
		}
	}
}

// As root, with no database URL and no local server binaries, a program
// cannot run downloaded ones (initdb refuses root): it says so, and what
// to do, before downloading anything.
// Not parallel: it sets the environment.
func TestOpenDatabaseAsRootWithoutBinariesSaysHowToProceed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: tests what a program running as root does, and this test runs as a normal user")
	}
	var requests atomic.Int32
	repo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.NotFound(w, r)
	}))
	defer repo.Close()
	t.Setenv(pgcluster.EnvBinDir, t.TempDir())
	t.Setenv(exampleprog.EnvDownloadURL, repo.URL)
	_, _, err := exampleprog.OpenDatabase(context.Background(), exampleprog.Database{Progress: io.Discard})
	if err == nil {
		t.Fatal("OpenDatabase succeeded with no URL and no binaries, as root")
	}
	for _, want := range []string{"cannot run as root", "DATABASE_URL", "install the PostgreSQL server binaries"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests to the repository, want none", n)
	}
}
