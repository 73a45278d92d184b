package store

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

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
		"acquire":       {"acme", "k1", "test", []byte{0}, []byte("{}"), ttl, token, id, "", nil},
		"advance":       {id, token, "charged", []byte("{}"), ttl, "acme"},
		"finish":        {id, token, []byte("{}"), 201, []byte(nil), []byte{}, "acme"},
		"release":       {id, token, "", "", 0, false, "acme"},
		"adopt":         {id, token, "d2", "charged", "acme"},
		"mark call":     {id, token, ttl, "charge", "acme"},
		"renew":         {id, token, ttl, "acme"},
		"claim one":     {ttl, time.Minute, time.Second, time.Minute, token, "acme", id},
		"take decision": {id, token, "acme"},
		"claim key":     {"acme", "k1", ttl, token},
	}
	sqls := map[string]string{
		"acquire": acquireDistributedSQL, "advance": advanceSQL.distributed, "finish": finishSQL.distributed,
		"release": releaseSQL.distributed, "adopt": adoptSQL.distributed, "mark call": markCallSQL.distributed,
		"renew": renewDistributedSQL, "claim one": claimOneSQL, "take decision": takeResolutionSQL.distributed,
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
