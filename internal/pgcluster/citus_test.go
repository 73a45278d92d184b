package pgcluster

import (
	"testing"

	"github.com/atomicphase/atomicphase/internal/testenv"
)

// TestCitusWorkerFailsOverToItsSynchronousStandby kills the only worker of
// a Citus cluster, promotes its synchronous standby and points the
// coordinator at it: every row committed through the coordinator is there,
// and the coordinator writes to it.
func TestCitusWorkerFailsOverToItsSynchronousStandby(t *testing.T) {
	t.Parallel()
	if err := CitusInstalled(); err != nil {
		testenv.SkipWithout(t, "citus", err)
	}
	ctx := t.Context()
	c, err := StartCitus(ctx, 1, "synchronous_commit=on")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	worker := c.Workers[0]
	t.Cleanup(func() {
		if err := worker.Stop(); err != nil {
			t.Error(err)
		}
	})
	dsn := c.Coordinator.DSN("postgres")
	execSQL(t, dsn, "CREATE TABLE rows (id int PRIMARY KEY)")
	execSQL(t, dsn, "SELECT create_distributed_table('rows', 'id')")
	standby, err := StartStandby(ctx, worker)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := standby.Stop(); err != nil {
			t.Error(err)
		}
	})
	if err := worker.SetSynchronous(ctx, true); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		execSQL(t, dsn, "INSERT INTO rows VALUES ($1)", i)
	}

	if err := worker.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.ReplaceWorker(ctx, worker, standby); err != nil {
		t.Fatal(err)
	}
	if c.Workers[0] != standby {
		t.Error("the promoted standby is not among the workers after ReplaceWorker")
	}
	if got := rowIDs(t, dsn); len(got) != 100 {
		t.Errorf("through the coordinator after the failover: %d of the 100 committed rows", len(got))
	}
	execSQL(t, dsn, "INSERT INTO rows VALUES (100)")
	if err := c.ReplaceWorker(ctx, worker, standby); err == nil {
		t.Error("ReplaceWorker replaced a cluster that is no longer a worker")
	}
}
