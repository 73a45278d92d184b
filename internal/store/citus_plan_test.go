package store

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

// TestCitusEveryPerKeyStatementReachesOneShard: on a key table distributed
// by tenant, each statement about one key names the tenant, so Citus plans
// it as one task on one node. Without the tenant the fenced writes ran on
// every shard with two-phase commit.
func TestCitusEveryPerKeyStatementReachesOneShard(t *testing.T) {
	t.Parallel()
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()
	id, token := uuidArg(uuid.New()), uuidArg(uuid.New())
	ttl := 30 * time.Second
	statements := map[string][]any{
		"acquire":        {"acme", "k1", "test", []byte{0}, []byte("{}"), ttl, token, id, "", nil},
		"read the key":   {"acme", "k1", []byte{0}},
		"take over":      {"acme", "k1", "test", []byte{0}, ttl, token, ""},
		"advance":        {id, token, "charged", []byte("{}"), ttl, "started", "acme"},
		"finish":         {id, token, []byte("{}"), 201, []byte(nil), []byte{}, "started", "acme"},
		"release":        {id, token, "", "", 0, false, "acme"},
		"adopt":          {id, token, "d2", "charged", "acme"},
		"mark call":      {id, token, ttl, "charge", "started", "acme"},
		"renew":          {id, token, ttl, "acme"},
		"claim one":      {ttl, time.Minute, time.Second, time.Minute, token, "acme", id, 10},
		"read decision":  {id, token, "acme"},
		"clear decision": {id, token, []byte(`{}`), "acme"},
		"claim key":      {"acme", "k1", ttl, token},
	}
	sqls := map[string]string{
		"acquire": acquireDistributedSQL, "read the key": foundDistributedSQL, "take over": takeOverDistributedSQL, "advance": byID(advanceUpdate, 7).distributed, "finish": byID(finishUpdate, 8).distributed,
		"release": releaseSQL.distributed, "adopt": adoptSQL.distributed, "mark call": markCallSQL.distributed,
		"renew": renewDistributedSQL, "claim one": claimOneSQL, "read decision": readResolutionDistributedSQL, "clear decision": clearResolutionDistributedSQL,
		"claim key": claimKeySQL,
	}
	tasks := regexp.MustCompile(`Task Count: (\d+)`)
	for name, sql := range sqls {
		rows, err := db.Query(ctx, "EXPLAIN "+sql, statements[name]...)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		text := strings.Join(plan, "\n")
		counts := tasks.FindAllStringSubmatch(text, -1)
		if len(counts) == 0 {
			t.Errorf("%s: no distributed plan:\n%s", name, text)
		}
		for _, c := range counts {
			if c[1] != "1" {
				t.Errorf("%s runs %s tasks, want 1:\n%s", name, c[1], text)
			}
		}
		if strings.Contains(text, "Distributed Subplan") {
			t.Errorf("%s needs a subplan (more than one round trip to the nodes):\n%s", name, text)
		}
	}
}

// TestCitusHoldersStatementsArePlannedOnTheFastPathOnce: every statement of
// a request's path on a distributed key table (the acquire's three, and
// each write of a holder, the UPDATE inside its function for the writes
// that commit a phase) is one Citus plans on its fast path, and whose
// plan, once prepared, it keeps: ten executions of each are planned at most
// six times (PostgreSQL's five custom plans and one generic), where the
// fenced CTE was planned in full on every call. The coordinator keeps its
// own generic plan of each statement too, the calls of the commit
// functions included.
//
// It runs alone, not in parallel: another test's DDL on the cluster (a
// schema created or dropped, a table distributed) invalidates the cached
// plans, and a statement would be planned again for a reason of its own.
func TestCitusHoldersStatementsArePlannedOnTheFastPathOnce(t *testing.T) {
	db := pgtest.CitusPool(t, nil)
	ctx := context.Background()
	var mu sync.Mutex
	var notices []string
	cfg := db.Config().ConnConfig.Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// Held keys, so that each write matches its row, as a holder's does;
	// a key for each finish, which raises on a key already finished.
	const runs = 10
	held := make([]*Row, runs)
	for i := range held {
		_, row, err := Acquire(ctx, db, Request{Tenant: "acme", Key: "k" + strconv.Itoa(i), Workflow: "test", Params: []byte("{}"),
			TTL: 30 * time.Second, Distributed: true})
		if err != nil {
			t.Fatal(err)
		}
		held[i] = row
	}
	id, token := uuidArg(held[0].ID), uuidArg(held[0].LockToken)
	ttl := intervalArg(30 * time.Second)
	statements := []struct {
		name string
		sql  string
		args func(run int) []any
	}{
		{"acquire", acquireDistributedSQL, func(int) []any { return []any{"acme", "k0", "test", []byte{0}, []byte("{}"), ttl, token, id, "", nil} }},
		{"read the key", foundDistributedSQL, func(int) []any { return []any{"acme", "k0", []byte{0}} }},
		{"take over", takeOverDistributedSQL, func(int) []any { return []any{"acme", "k0", "test", []byte{0}, ttl, token, ""} }},
		{"advance", advanceSQL.distributed, func(run int) []any {
			// The first run moves the key from started to charged, and
			// each later one from charged to charged.
			from := "charged"
			if run == 0 {
				from = "started"
			}
			return []any{id, token, "charged", []byte("{}"), ttl, from, "acme"}
		}},
		{"finish", finishSQL.distributed, func(run int) []any {
			return []any{uuidArg(held[run].ID), uuidArg(held[run].LockToken), []byte("{}"), 201, []byte(nil), []byte{}, "started", "acme"}
		}},
		{"release", releaseSQL.distributed, func(int) []any { return []any{id, token, "", "", 0, false, "acme"} }},
		{"adopt", adoptSQL.distributed, func(int) []any { return []any{id, token, "d2", "charged", "acme"} }},
		{"mark call", markCallSQL.distributed, func(int) []any { return []any{id, token, ttl, "charge", "started", "acme"} }},
		{"renew", renewDistributedSQL, func(int) []any { return []any{id, token, ttl, "acme"} }},
	}
	for _, s := range statements {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL client_min_messages = debug2`); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		notices = nil
		mu.Unlock()
		for run := range runs {
			rows, err := tx.Query(ctx, s.sql, s.args(run)...)
			if err == nil {
				rows.Close()
				err = rows.Err()
			}
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
		}
		// The coordinator's own plan of the statement as sent: PostgreSQL
		// keeps a generic plan after five custom ones unless the generic
		// plan costs more, which Citus makes it do for a call of a
		// function it has distributed to its nodes (function call
		// delegation needs the arguments' values), so such a call would
		// be planned again on every commit.
		var custom int64
		if err := tx.QueryRow(ctx, `SELECT custom_plans FROM pg_prepared_statements WHERE statement = $1`, s.sql).Scan(&custom); err != nil {
			t.Fatalf("%s: the coordinator's prepared statement: %v", s.name, err)
		}
		if custom > 5 {
			t.Errorf("%s got a custom plan on the coordinator in %d of %d executions, want a generic plan after the fifth", s.name, custom, runs)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		fast, planned := 0, 0
		for _, n := range notices {
			if strings.Contains(n, "fast-path router query") {
				fast++
			}
			if strings.Contains(n, "planning") || strings.Contains(n, "router plan") {
				planned++
			}
		}
		got := strings.Join(notices, "\n")
		mu.Unlock()
		// Citus plans every INSERT ... VALUES as a router query on its
		// own path, which says so in other words.
		if fast == 0 && !strings.HasPrefix(strings.TrimSpace(s.sql), "INSERT") {
			t.Errorf("%s is not planned on Citus's fast path:\n%s", s.name, got)
		}
		if planned > 6 {
			t.Errorf("%s was planned %d times in %d executions, want at most 6:\n%s", s.name, planned, runs, got)
		}
	}
}

// TestCitusCommitFunctionsRunTheStatementsOfTheStore: the functions that
// commit a phase on Citus (migration 013) run, word for word, the UPDATE
// of the store's distributed form, and raise AP001 when it matched no row;
// a change to one of the statements without a migration fails here.
func TestCitusCommitFunctionsRunTheStatementsOfTheStore(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t)
	ctx := context.Background()
	space := regexp.MustCompile(`\s+`)
	for function, update := range map[string]string{
		"atomicphase_advance_from": byID(advanceUpdate, 7).distributed,
		"atomicphase_finish_from":  byID(finishUpdate, 8).distributed,
	} {
		var body string
		if err := db.QueryRow(ctx, `SELECT prosrc FROM pg_proc WHERE oid = to_regproc($1)`, function).Scan(&body); err != nil {
			t.Fatalf("%s: %v", function, err)
		}
		want := space.ReplaceAllString(strings.TrimSpace(update), " ") + "; IF NOT FOUND THEN PERFORM atomicphase_lease_lost(); END IF;"
		if got := space.ReplaceAllString(body, " "); !strings.Contains(got, want) {
			t.Errorf("%s runs\n%s\nwant it to run\n%s", function, got, want)
		}
	}
}
