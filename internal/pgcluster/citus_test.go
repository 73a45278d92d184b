package pgcluster

import (
	"testing"

	"github.com/atomicphase/atomicphase/internal/testenv"
)

// inDoubt names the prepared transaction of a two-phase commit that the
// test below leaves in doubt on a worker, as Citus names them: citus_ and
// the coordinator's group (0), a backend's PID, a distributed transaction
// number and a connection number, none of them in use.
const inDoubt = "citus_0_1_999999999_1"

// TestCitusWorkerFailsOverToItsSynchronousStandby kills the only worker of
// a Citus cluster, promotes its synchronous standby and points the
// coordinator at it: every row committed through the coordinator is there,
// the coordinator writes to it, and Citus's recovery finds there the
// prepared transaction of a two-phase commit the worker's death left in
// doubt, and commits it, as the coordinator had decided.
func TestCitusWorkerFailsOverToItsSynchronousStandby(t *testing.T) {
	t.Parallel()
	if err := CitusInstalled(); err != nil {
		testenv.SkipWithout(t, "citus", err)
	}
	ctx := t.Context()
	// Recovery runs only when the test calls it, not from Citus's
	// maintenance daemon on the worker before its death.
	c, err := StartCitus(ctx, 1, "synchronous_commit=on", "citus.recover_2pc_interval=-1")
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
	// A two-phase commit cut short by the worker's death: prepared on the
	// worker, and committed on the coordinator, whose commit record
	// (pg_dist_transaction) says to commit it on the worker too.
	execSQL(t, worker.DSN("postgres"), "CREATE TABLE in_doubt (id int)")
	execSQL(t, worker.DSN("postgres"), "BEGIN; INSERT INTO in_doubt VALUES (1); PREPARE TRANSACTION '"+inDoubt+"'")
	execSQL(t, dsn, "INSERT INTO pg_dist_transaction (groupid, gid) SELECT groupid, $1 FROM pg_dist_node WHERE nodename = $2",
		inDoubt, worker.dir)

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
	if n := queryOne[int](t, dsn, "SELECT recover_prepared_transactions()"); n != 1 {
		t.Errorf("recover_prepared_transactions after the failover recovered %d transactions, want 1", n)
	}
	if n := queryOne[int64](t, standby.DSN("postgres"), "SELECT count(*) FROM in_doubt"); n != 1 {
		t.Errorf("the promoted standby has %d rows of the transaction left in doubt, want 1: it was not committed", n)
	}
	if err := c.ReplaceWorker(ctx, worker, standby); err == nil {
		t.Error("ReplaceWorker replaced a cluster that is no longer a worker")
	}
}
