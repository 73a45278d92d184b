package pgtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestExternalServerLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A server with no stop function is treated as external: this one
	// happens to be the shared server, seen through its admin DSN.
	admin := Server(t).AdminDSN
	srv, err := newServer(ctx, admin, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	name, err := srv.createDatabase(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := withDatabase(admin, name)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var table *string
	if err := conn.QueryRow(ctx, "SELECT to_regclass('idempotency_keys')::text").Scan(&table); err != nil {
		t.Fatal(err)
	}
	if table == nil {
		t.Error("cloned database has no idempotency_keys table")
	}
	// Left open on purpose: the drop must not be stopped by it.
	defer conn.Close(ctx)

	if err := srv.dropDatabase(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := srv.close(ctx); err != nil {
		t.Fatal(err)
	}
	adminConn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer adminConn.Close(ctx)
	var left int
	if err := adminConn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = ANY($1)",
		[]string{name, srv.template}).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d of the test and template databases remain after close", left)
	}
}

func TestSweepDropsOnlyStaleDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, Server(t).AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer, so that the cleanup dropping fresh, which
	// runs first, can still use it.
	t.Cleanup(func() { conn.Close(ctx) })

	fresh := databaseName("fresh")
	stale := databaseNameAt("stale", time.Now().Add(-2*staleDatabaseAge))
	for _, name := range []string{fresh, stale} {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(fresh)) })

	sweepStaleDatabases(ctx, conn)

	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datname = ANY($1)", []string{fresh, stale})
	if err != nil {
		t.Fatal(err)
	}
	exists, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(exists) != 1 || exists[0] != fresh {
		t.Errorf("after sweep, databases %q remain; want only %s", exists, fresh)
	}
}

func TestDatabaseName(t *testing.T) {
	t.Parallel()
	long := "TestSomething/with a very long subtest name, punctuation & UPPER case, and more words"
	name := databaseName(long)
	if len(name) > 63 {
		t.Errorf("databaseName(%q) = %q, %d bytes long", long, name, len(name))
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			t.Errorf("databaseName(%q) = %q, which contains %q", long, name, r)
		}
	}
	if !strings.Contains(name, "_testsomething_with_a_very") {
		t.Errorf("databaseName(%q) = %q, which does not name the test", long, name)
	}
	created, ok := databaseCreated(name)
	if !ok || time.Since(created) > time.Minute {
		t.Errorf("databaseCreated(%q) = %v, %v", name, created, ok)
	}
	if name == databaseName(long) {
		t.Errorf("databaseName returned %q twice", name)
	}
}

func TestWithDatabaseKeepsTheRestOfTheDSN(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://alice:secret@db.example:6543/app?sslmode=disable",
		"host=db.example port=6543 user=alice password=secret dbname=app sslmode=disable",
		"host=db.example port=6543 user=alice password=secret sslmode=disable",
	} {
		got, err := withDatabase(dsn, "pgtest_x")
		if err != nil {
			t.Fatalf("withDatabase(%q): %v", dsn, err)
		}
		config, err := pgx.ParseConfig(got)
		if err != nil {
			t.Fatalf("withDatabase(%q) = %q: %v", dsn, got, err)
		}
		if config.Database != "pgtest_x" || config.Host != "db.example" || config.Port != 6543 ||
			config.User != "alice" || config.Password != "secret" || config.TLSConfig != nil {
			t.Errorf("withDatabase(%q) = %q, which parses to %+v", dsn, got, config.Config)
		}
	}
}

func TestNoServerErrorNamesEveryFix(t *testing.T) {
	t.Parallel()
	docker, local := errors.New("no docker here"), errors.New("no initdb here")
	err := error(&noServerError{mentionEnv: true, docker: docker, local: local})
	for _, want := range []string{EnvDSN, "Docker", "no docker here", "initdb", "no initdb here"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if !errors.Is(err, docker) || !errors.Is(err, local) {
		t.Errorf("error %q does not wrap its causes", err)
	}
	embedded := (&noServerError{docker: docker, local: local}).Error()
	if strings.Contains(embedded, EnvDSN) {
		t.Errorf("Embedded's error %q mentions %s, which Embedded ignores", embedded, EnvDSN)
	}
}

func TestSchemaNameLeavesRoomForRiverChannels(t *testing.T) {
	t.Parallel()
	long := "TestSomething/with a very long subtest name, punctuation & UPPER case, and more words"
	name := schemaName(long)
	if channel := name + ".river_leadership"; len(channel) > 63 {
		t.Errorf("schemaName(%q) = %q: River's channel %q is %d bytes long, over 63", long, name, channel, len(channel))
	}
	if !strings.HasPrefix(name, databasePrefix) || !strings.Contains(name, "_testsomething") {
		t.Errorf("schemaName(%q) = %q, which does not name the test", long, name)
	}
}
