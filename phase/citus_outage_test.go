package phase_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/internal/testenv"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// TestCitusTheCompleterDrainsTheReachableWorkersWhileOneIsDown: with one
// worker of a Citus cluster down, the completer still finishes the
// abandoned keys of the tenants on the other, though its scan for due keys
// and its burial of keys out of attempts read every shard; the keys on the
// worker that is down wait for it, and finish once it is back. No key's
// committed phase runs twice.
func TestCitusTheCompleterDrainsTheReachableWorkersWhileOneIsDown(t *testing.T) {
	t.Parallel()
	if err := pgcluster.CitusInstalled(); err != nil {
		testenv.SkipWithout(t, "citus", err)
	}
	ctx := t.Context()
	cluster, err := pgcluster.StartCitus(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Stop(); err != nil {
			t.Error(err)
		}
	})
	db, err := pgxpool.New(ctx, cluster.Coordinator.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := atomicphase.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := atomicphase.Distribute(ctx, db); err != nil {
		t.Fatal(err)
	}

	// The first phase commits once per key; the second fails while
	// failing, leaving the key to the completer.
	var (
		failing atomic.Bool
		mu      sync.Mutex
		firsts  = map[string]int{}
	)
	w, err := phase.NewWorkflow("noted",
		phase.Local("first", func(_ context.Context, _ pgx.Tx, in *phase.Input[order, struct{}]) (phase.Result, error) {
			mu.Lock()
			defer mu.Unlock()
			firsts[in.Tenant]++
			return phase.Next(), nil
		}),
		phase.Local("second", func(context.Context, pgx.Tx, *phase.Input[order, struct{}]) (phase.Result, error) {
			if failing.Load() {
				return phase.Result{}, errors.New("provider down")
			}
			return phase.JSON(201, "done"), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	logger := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := phase.NewClient(db, &phase.Config{Logger: logger,
		Completer: recovery.CompleterConfig{Interval: -1, StuckAfter: -1, Backoff: -1},
		Reaper:    recovery.ReaperConfig{Interval: -1}}, w)
	if err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	down := cluster.Workers[1]
	var onDown, onUp []string
	for i := range 40 {
		tenant := fmt.Sprintf("t%02d", i)
		if _, err := w.Run(ctx, c, tenant, "k", order{}); err == nil {
			t.Fatalf("run of %s succeeded while the second phase fails", tenant)
		}
		var node string
		if err := db.QueryRow(ctx, `SELECT n.nodename FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
WHERE p.shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)`, tenant).Scan(&node); err != nil {
			t.Fatal(err)
		}
		if node == down.Host() {
			onDown = append(onDown, tenant)
		} else {
			onUp = append(onUp, tenant)
		}
	}
	if len(onDown) == 0 || len(onUp) == 0 {
		t.Fatalf("tenants %v on the worker to stop, %v on the other; want some on each", onDown, onUp)
	}
	failing.Store(false)
	if err := down.Down(); err != nil {
		t.Fatal(err)
	}
	// point reads one key's recovery point, a statement routed to its
	// shard alone.
	point := func(tenant string) (string, error) {
		var p string
		err := db.QueryRow(ctx, `SELECT recovery_point FROM idempotency_keys WHERE tenant = $1 AND idempotency_key = 'k'`,
			tenant).Scan(&p)
		return p, err
	}
	finished := func(tenants []string) bool {
		for _, tenant := range tenants {
			if p, err := point(tenant); err != nil || p != keyrow.Finished {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(30 * time.Second); !finished(onUp); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("with a worker down, the keys of the other's tenants %v are not all finished after 30s", onUp)
		}
		if _, err := c.Complete(ctx); err != nil {
			t.Fatalf("a pass with a worker down: %v", err)
		}
	}
	if _, err := point(onDown[0]); err == nil {
		t.Fatal("a key on the worker that is down was read; want an error")
	}
	// The completer says why it drains some keys only, and that its
	// burial waits.
	for _, want := range []string{"a node did not answer the scan for due keys", "burying keys out of attempts failed"} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("the completer's warnings with a worker down lack %q:\n%s", want, logged.String())
		}
	}

	if err := down.Up(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !finished(onDown); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("with the worker back, the keys of its tenants %v are not all finished after 30s", onDown)
		}
		if _, err := c.Complete(ctx); err != nil {
			t.Logf("a pass as the worker comes back: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, tenant := range append(onUp, onDown...) {
		if firsts[tenant] != 1 {
			t.Errorf("the first phase of %s's key ran %d times; want once", tenant, firsts[tenant])
		}
	}
}
