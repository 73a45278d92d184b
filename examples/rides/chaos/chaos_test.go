//go:build linux

package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/caller"
	"github.com/atomicphase/atomicphase/examples/internal/exampleprog/exampleprogtest"
	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/examples/rides/sim"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// soakEnv names the environment variable that turns both tests into a soak:
// a Go duration (10m) of traffic replacing each test's default.
const soakEnv = "ATOMICPHASE_CHAOS_SOAK"

const (
	// apiProcesses is how many `rides serve` processes share the database.
	apiProcesses = 3
	// leaseTTL is the API's lease, short so that the runs of killed
	// processes are taken over within the test.
	leaseTTL = 2 * time.Second
	// stripeKey is the API key the API processes and the checks use.
	stripeKey = "sk_test_chaos"
	// settleTimeout bounds the wait for the completer to finish every key.
	settleTimeout = time.Minute
	// startTimeout bounds one (re)start of a process, retries included.
	startTimeout = time.Minute
)

// Faults planned on the fake Stripe while the chaos runs: charges that fail
// before executing, and charges whose answer is lost after they executed.
const faultPlan = `{"fail_before_charge_rate": 0.03, "timeout_after_charge_rate": 0.05}`

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// binDir holds the rides binary that ridesBinary builds.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rides-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	if err := pgtest.Release(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = max(code, 1)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// ridesBinary builds ./examples/rides once per test binary, without the
// race detector: the processes under test must start fast enough to be
// killed several times a second on a small CI machine.
var ridesBinary = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(binDir, "rides")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/atomicphase/atomicphase/examples/rides").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build rides: %w\n%s", err, out)
	}
	return bin, nil
})

func TestChaosKillsAndTerminatedSessions(t *testing.T) {
	t.Parallel()
	runChaos(t, scenario{traffic: 45 * time.Second})
}

// TestChaosRollingDeploy runs the old and the new version of the API side by
// side, as a rolling deploy does, through kills and terminated sessions,
// then stops the old one: no ride charged twice or skipped past its fraud
// check, and every key finished by the new version.
func TestChaosRollingDeploy(t *testing.T) {
	t.Parallel()
	runChaos(t, scenario{traffic: 30 * time.Second, rolling: true})
}

func TestChaosPostgresRestart(t *testing.T) {
	t.Parallel()
	runChaos(t, scenario{traffic: 30 * time.Second, restartPostgres: true})
}

// scenario is what one chaos test does besides killing API processes and
// terminating sessions, which every test without replication does.
type scenario struct {
	// traffic is how long riders start new rides while the chaos runs;
	// soakEnv, or failoverSoakEnv with replication and without Citus
	// (whose worker fails over once), replaces it.
	traffic time.Duration
	// restartPostgres restarts the cluster halfway through the traffic, or
	// once a minute when the traffic lasts longer than two minutes.
	restartPostgres bool
	// accept runs the API processes with -accept: 202 Accepted once the
	// ride is created, the charge in the background.
	accept bool
	// rolling is a rolling deploy caught halfway: the first API process
	// serves the workflow's first definition, the others its next one
	// (-fraud-check), and the first is stopped for good when the traffic
	// ends, so that the upgraded processes finish every key.
	rolling bool
	// replication puts the rides database on a primary with a streaming
	// standby and fails over during the traffic (see failOvers). The API
	// processes are then neither killed nor cut off: the failover is the
	// fault under test, and they must live through it. With citus, the
	// worker killed has the standby, and fails over to it.
	replication replication
	// citus puts the rides database on a Citus cluster of its own, two API
	// processes on its coordinator, and kills a worker node mid-charge (see
	// killWorker). The API processes are neither killed nor cut off, and
	// the fake Stripe only slows charges down, so that every failed answer
	// the riders get is the outage's.
	citus bool
	// defaults runs the API processes with every default of the lease
	// and the completer.
	defaults bool
}

// chaosCounts counts what the chaos did.
type chaosCounts struct {
	kills, failedStarts, terminated, pgRestarts atomic.Int64
	// unrecovered counts Postgres restarts after which the API process
	// spared from kills did not serve a ride again within recoverTimeout;
	// slowestRecovery is the longest it took one to.
	unrecovered     atomic.Int64
	slowestRecovery atomic.Int64 // nanoseconds
}

// timings are the phases of a test.
type timings struct {
	setup, traffic, settle time.Duration
}

func runChaos(t *testing.T, sc scenario) {
	env := soakEnv
	if sc.replication != noReplication && !sc.citus {
		env = failoverSoakEnv
	}
	if v := os.Getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 10m", env, v)
		}
		sc.traffic = d
	}
	began := time.Now()
	s := setup(t, sc)
	ctx := t.Context()
	if sc.citus {
		s.setFaults(ctx, citusFaultPlan)
	} else {
		s.setFaults(ctx, faultPlan)
	}
	var times timings
	times.setup = time.Since(began)

	var counts chaosCounts
	fo := newFailovers(len(s.apis))
	chaosCtx, stopChaos := context.WithTimeout(ctx, sc.traffic)
	defer stopChaos()
	trafficCtx, trafficTime := ctx, sc.traffic
	var wg sync.WaitGroup
	var riders []string
	out := &workerOutage{}
	switch {
	case sc.citus:
		riders = s.citus.riders
		wg.Go(func() { s.killWorker(chaosCtx, out, fo) })
	case sc.replication == noReplication:
		wg.Go(func() { s.killAPIs(chaosCtx, &counts) })
		wg.Go(func() { s.terminateSessions(chaosCtx, &counts) })
	default:
		// The failovers end the traffic once they are done, however long
		// promotions and rebuilds took.
		var stopTraffic context.CancelFunc
		trafficCtx, stopTraffic = context.WithCancel(ctx)
		defer stopTraffic()
		trafficTime = 4*sc.traffic + 2*time.Minute
		wg.Go(func() {
			defer stopTraffic()
			s.failOvers(trafficCtx, sc, fo)
		})
	}
	if sc.restartPostgres {
		every := sc.traffic / 2
		if sc.traffic > 2*time.Minute {
			every = time.Minute
		}
		wg.Go(func() { s.restartPostgres(chaosCtx, every, &counts) })
	}
	// Rides still unanswered when the traffic ends are retried to their
	// answer with the chaos already stopped.
	st, err := sim.Run(trafficCtx, sim.Config{APIURLs: s.apiURLs(), Duration: trafficTime, GiveUpAfter: 10 * time.Second,
		Riders: riders, Observe: fo.observe})
	stopChaos()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	times.traffic = time.Since(began) - times.setup
	if sc.rolling {
		s.apis[0].kill() // the last process of the old version goes
	}

	s.setFaults(ctx, `{"fail_before_charge_rate": 0, "timeout_after_charge_rate": 0, "delay_ms": 0}`)
	settled, report, err := s.settle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sc.replication != noReplication {
		// Riders whose acknowledged ride a failover lost retry it now, as
		// a client that learns of the loss would.
		if report, err = s.retryLost(ctx, fo); err != nil {
			t.Fatal(err)
		}
	}
	if out.failover {
		if err := s.preparedOnStandby(ctx, &out.left); err != nil {
			t.Fatal(err)
		}
	}
	times.settle = time.Since(began) - times.setup - times.traffic

	var crashes int
	for _, p := range append([]*process{s.stripe}, s.apis...) {
		crashes += int(p.crashes.Load())
	}
	checks := []check{
		{"processes that exited on their own", crashes, 0},
		{"API not serving again after a Postgres restart", int(counts.unrecovered.Load()), 0},
		{"every key finished", report.UnfinishedKey, 0},
		{"no key locked", report.LockedKeys, 0},
		{"charges at Stripe = charged rides", report.Charges, report.ChargedRides},
		{"rides charged twice", report.DoubleCharged, 0},
		{"charges without a ride", report.ChargesWithoutRide, 0},
		{"recorded charge not Stripe's", report.ChargeMismatches, 0},
		{"201 without a charge", report.CreatedUncharged, 0},
		{"receipts for uncharged rides", report.ReceiptsUncharged, 0},
		// A key whose acknowledged ride a failover lost is answered a new
		// ride when retried: that second answer is the loss, counted
		// below, not an inconsistency.
		{"keys answered two final responses", int(st.Inconsistent) - fo.explained(), 0},
	}
	if sc.replication != noReplication {
		checks = append(checks, fo.checks(sc)...)
	}
	if sc.rolling {
		checks = append(checks, s.deployChecks(ctx)...)
	}
	if sc.citus {
		checks = append(checks, out.checks()...)
	}
	t.Log("\n" + summary(&counts, fo, out, st, settled, report, checks, times))
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, c.got, c.want)
		}
	}
	for _, f := range report.Failures() {
		t.Errorf("invariant violated: %s", f)
	}
	if st.Rides == 0 || report.Created == 0 {
		t.Errorf("no traffic got through: %d rides requested, %d created", st.Rides, report.Created)
	}
	if t.Failed() {
		s.evidence(ctx)
		for _, u := range fo.unexplained() {
			t.Log(u)
		}
	}
}

// check is an invariant of the final state: got must equal want.
type check struct {
	name      string
	got, want int
}

// system is one test's database, fake Stripe and API processes.
type system struct {
	t *testing.T
	// cluster is the test's own Postgres, when it restarts it; replicated
	// its primary and standby, when it fails over.
	cluster    *pgtest.Cluster
	replicated *replicated
	citus      *citusRides
	dbName     string
	// pool connects to the rides database; admin to the maintenance
	// database, so that terminating the rides sessions spares it;
	// stripePool to the fake Stripe's.
	pool, admin, stripePool *pgxpool.Pool
	stripe                  *process
	apis                    []*process
	// killing is held by the killer from choosing a process to having it
	// listening again; spared is the index of the API process it leaves
	// alone, or -1.
	killing sync.Mutex
	spared  int
	logDir  string
	// rolling is set for a rolling deploy (scenario.rolling).
	rolling bool
}

// setup starts the rides database, migrated and seeded, the fake Stripe,
// and the API processes, and kills them all when t ends. A scenario that
// restarts Postgres gets a cluster of its own from the local server
// binaries, since restarting a shared server would break other tests, and
// one that fails over a primary and a standby of its own (see
// startReplicated); the others use the test server that every test uses
// (see pgtest).
func setup(t *testing.T, sc scenario) *system {
	t.Helper()
	// The processes' binary builds while the databases start.
	go ridesBinary()
	ctx := t.Context()
	s := &system{t: t, spared: -1, rolling: sc.rolling}
	var dsn string
	var err error
	var stripeDSN func() string
	switch {
	case sc.citus:
		// The fake Stripe plays another company's system, on a server of
		// its own.
		stripeDSN = stripeDatabase(t)
		s.citus = startCitusRides(t, sc.replication)
		dsn = s.citus.dsn
	case sc.replication != noReplication:
		// The fake Stripe plays another company's system: its memory of
		// idempotency keys does not fail over with our database.
		stripeDSN = stripeDatabase(t)
		s.replicated = startReplicated(t, sc.replication == synchronous)
		dsn = s.replicated.dsn
	case sc.restartPostgres:
		s.cluster, err = pgtest.StartCluster(ctx)
		if err != nil {
			t.Fatalf("this test restarts Postgres, so it needs a cluster of its own from the PostgreSQL server binaries "+
				"(initdb and postgres), even when %s is set: %v", pgtest.EnvDSN, err)
		}
		t.Cleanup(func() {
			if err := s.cluster.Stop(); err != nil {
				t.Error(err)
			}
		})
		s.admin = newPool(t, s.cluster.DSN("postgres"))
		if _, err := s.admin.Exec(ctx, "CREATE DATABASE rides"); err != nil {
			t.Fatal(err)
		}
		dsn = s.cluster.DSN("rides")
	default:
		dsn = pgtest.DSN(t)
		s.admin = newPool(t, pgtest.Server(t).AdminDSN)
	}
	s.pool = newPool(t, dsn)
	if err := s.pool.QueryRow(ctx, "SELECT current_database()").Scan(&s.dbName); err != nil {
		t.Fatal(err)
	}
	if stripeDSN != nil {
		// startReplicated migrated the rides database, before the base
		// backup; startCitusRides distributed it.
		s.stripePool = newPool(t, stripeDSN())
	} else {
		stripeDSN = func() string { return dsn }
		s.stripePool = s.pool
		// The processes migrate too, each at its start; the test reads
		// the tables before they are up.
		if err := ride.Migrate(ctx, s.pool); err != nil {
			t.Fatal(err)
		}
		if err := fakestripe.Migrate(ctx, s.pool); err != nil {
			t.Fatal(err)
		}
		if err := ride.Seed(ctx, s.pool); err != nil {
			t.Fatal(err)
		}
	}

	// The logs of a failed test are kept for the post-mortem.
	s.logDir, err = os.MkdirTemp("", "rides-chaos-logs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("process logs kept in %s", s.logDir)
			return
		}
		os.RemoveAll(s.logDir)
	})

	bin, err := ridesBinary()
	if err != nil {
		t.Fatal(err)
	}
	stripeAddr := exampleprogtest.FreeAddr(t)
	s.stripe = s.newProcess(bin, "fakestripe", stripeAddr, "fakestripe", "-addr", stripeAddr, "-database-url", stripeDSN())
	apis := apiProcesses
	if sc.citus {
		apis = citusAPIProcesses
	}
	for i := range apis {
		addr := exampleprogtest.FreeAddr(t)
		args := []string{"serve", "-addr", addr,
			"-database-url", dsn, "-stripe-url", "http://" + stripeAddr, "-stripe-key", stripeKey}
		if !sc.defaults {
			args = append(args, "-lease-ttl", leaseTTL.String(), "-completer-interval", "500ms", "-completer-stuck-after", "1s")
		}
		if sc.accept {
			args = append(args, "-accept")
		}
		if sc.rolling && i > 0 {
			args = append(args, "-fraud-check")
		}
		if sc.citus {
			args = append(args, "-citus")
		}
		s.apis = append(s.apis, s.newProcess(bin, "api"+strconv.Itoa(i), addr, args...))
	}
	for _, p := range append([]*process{s.stripe}, s.apis...) {
		t.Cleanup(p.kill)
		if _, err := p.start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (s *system) apiURLs() []string {
	urls := make([]string, len(s.apis))
	for i, p := range s.apis {
		urls[i] = "http://" + p.addr
	}
	return urls
}

func (s *system) stripeClient() *ride.Stripe {
	return ride.NewStripeClient("http://"+s.stripe.addr, stripeKey, nil)
}

// setFaults replaces the fake Stripe's fault plan with the JSON plan.
func (s *system) setFaults(ctx context.Context, plan string) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.stripe.addr+"/_faults", strings.NewReader(plan))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("POST /_faults %s: %s %s", plan, resp.Status, body)
	}
}

// killAPIs kills a random API process with SIGKILL every 200 to 500 ms and
// starts it again, until ctx ends. It spares the process s.spared names.
// The restart outlives ctx, so no process is left down when the chaos stops.
func (s *system) killAPIs(ctx context.Context, c *chaosCounts) {
	for sleep(ctx, 200*time.Millisecond+rand.N(300*time.Millisecond)) {
		if err := s.killOne(context.WithoutCancel(ctx), c); err != nil {
			s.t.Error(err)
			return
		}
	}
}

func (s *system) killOne(ctx context.Context, c *chaosCounts) error {
	s.killing.Lock()
	defer s.killing.Unlock()
	i := rand.IntN(len(s.apis))
	if i == s.spared {
		i = (i + 1) % len(s.apis)
	}
	p := s.apis[i]
	p.kill()
	c.kills.Add(1)
	failed, err := p.start(ctx)
	c.failedStarts.Add(int64(failed))
	return err
}

// spare makes the killer leave the API process i alone (none when i is
// -1). It waits for a kill in progress, so a spared process is running.
func (s *system) spare(i int) {
	s.killing.Lock()
	defer s.killing.Unlock()
	s.spared = i
}

// terminateSQL ends up to two random sessions of the rides database:
// the API processes', the fake Stripe's and their River clients'.
const terminateSQL = `
SELECT count(*) FILTER (WHERE terminated) FROM (
    SELECT pg_terminate_backend(pid) AS terminated FROM pg_stat_activity
    WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'
    ORDER BY random() LIMIT 2
) t`

// terminateSessions ends two random application sessions every 300 ms
// until ctx ends.
func (s *system) terminateSessions(ctx context.Context, c *chaosCounts) {
	for sleep(ctx, 300*time.Millisecond) {
		var n int64
		// Errors are expected while Postgres restarts.
		if err := s.admin.QueryRow(ctx, terminateSQL, s.dbName).Scan(&n); err == nil {
			c.terminated.Add(n)
		}
	}
}

// recoverTimeout is how soon after a Postgres restart an API process that
// lived through it must serve a ride again.
const recoverTimeout = 20 * time.Second

// restartPostgres restarts the cluster every interval until ctx ends. Each
// time, one API process is spared from kills until it has served a ride
// after the restart, which shows the processes outlive Postgres rather than
// only being replaced by fresh ones.
func (s *system) restartPostgres(ctx context.Context, every time.Duration, c *chaosCounts) {
	for sleep(ctx, every) {
		i := rand.IntN(len(s.apis))
		s.spare(i)
		err := s.cluster.Restart(context.WithoutCancel(ctx))
		if err != nil {
			s.t.Error(err)
			return
		}
		c.pgRestarts.Add(1)
		restarted := time.Now()
		if err := rideOnce(ctx, s.apis[i].addr); err != nil {
			c.unrecovered.Add(1)
			s.t.Errorf("%s did not serve a ride within %v of a Postgres restart: %v", s.apis[i].name, recoverTimeout, err)
		} else if took := int64(time.Since(restarted)); took > c.slowestRecovery.Load() {
			c.slowestRecovery.Store(took)
		}
		s.spare(-1)
	}
}

// rideOnce requests a new ride from the API at addr, retrying with its key
// until it is created or recoverTimeout passes.
func rideOnce(ctx context.Context, addr string) error {
	key := fmt.Sprintf("chaos-probe-%d", rand.Int64())
	status, body, err := postRide(ctx, "http://"+addr, ride.UserEmail, rideForm, key)
	if err != nil {
		return err
	}
	if status != http.StatusCreated {
		return fmt.Errorf("answered %d %s", status, body)
	}
	return nil
}

// rideForm is the ride the tests' own requests ask for.
const rideForm = "origin_lat=1&origin_lon=2&target_lat=3&target_lon=4"

// postRide sends a ride request to the API at baseURL through package
// caller, which retries it with its key until an answer that will not
// change, or until recoverTimeout passes (an *caller.UnknownOutcomeError).
func postRide(ctx context.Context, baseURL, rider, form, key string) (status int, body string, err error) {
	c, err := caller.New(caller.Config{MaxElapsed: recoverTimeout, MaxAttempts: math.MaxInt32, MaxDelay: time.Second})
	if err != nil {
		return 0, "", err
	}
	req, err := rideRequest(context.WithoutCancel(ctx), baseURL, rider, form, key)
	if err != nil {
		return 0, "", err
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	return readAnswer(res.Response)
}

// sendRide sends a ride request to the API at baseURL once.
func sendRide(ctx context.Context, baseURL, rider, form, key string) (status int, body string, err error) {
	req, err := rideRequest(ctx, baseURL, rider, form, key)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	return readAnswer(resp)
}

func rideRequest(ctx context.Context, baseURL, rider, form, key string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/rides", strings.NewReader(form))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", rider)
	req.Header.Set("Idempotency-Key", key)
	return req, nil
}

// readAnswer reads and closes resp.
func readAnswer(resp *http.Response) (status int, body string, err error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", err
	}
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// settled is what the final completer runs did.
type settled struct {
	completed, failed, deadRetried int
}

// settle runs a completer with no idle time and no backoff until every key
// is finished and none is locked, retrying dead keys as an operator would,
// and returns what it did with the final report. Leases of killed runs
// expire within leaseTTL, so a couple of passes usually suffice.
func (s *system) settle(ctx context.Context) (settled, ride.Report, error) {
	var out settled
	sc := s.stripeClient()
	app, err := ride.New(ride.Config{
		Pool: s.pool, Stripe: sc, Logger: quiet,
		Client: phase.Config{
			LeaseTTL:  leaseTTL,
			Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1, Interval: -1},
			Reaper:    recovery.ReaperConfig{Interval: -1},
		},
		WithoutWorker: true,
		FraudCheck:    s.rolling,
	})
	if err != nil {
		return out, ride.Report{}, err
	}
	deadline := time.Now().Add(settleTimeout)
	for {
		res, err := app.Client.Complete(ctx)
		out.completed += res.Completed
		out.failed += res.Failed
		if err != nil {
			return out, ride.Report{}, err
		}
		dead, err := app.Client.List(ctx, keyrow.ListFilter{Status: keyrow.StatusDead, Limit: 1000})
		if err != nil {
			return out, ride.Report{}, err
		}
		for _, k := range dead.Keys {
			s.t.Logf("retrying dead key %s/%s (attempts %d, failures %d, recovery point %s, last error %q)",
				k.Tenant, k.Key, k.Attempts, k.Failures, k.RecoveryPoint, k.LastError)
			if err := app.Client.Retry(ctx, k.Tenant, k.Key); err != nil && !errors.Is(err, keyrow.ErrNotHeld) {
				return out, ride.Report{}, err
			}
			out.deadRetried++
		}
		report, err := ride.Verify(ctx, s.pool, sc, time.Time{})
		if err != nil {
			return out, report, err
		}
		if report.UnfinishedKey == 0 && report.LockedKeys == 0 || time.Now().After(deadline) {
			return out, report, nil
		}
		if !sleep(ctx, 250*time.Millisecond) {
			return out, report, ctx.Err()
		}
	}
}

// deployChecks are the invariants of a rolling deploy: every ride finished
// under the definition it started with, so each ride of the checked
// definition was checked exactly once and none of the first was; and both
// definitions served rides.
func (s *system) deployChecks(ctx context.Context) []check {
	first, err := ride.NewWorkflow(nil, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	next, err := ride.NewCheckedWorkflow(nil, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	var firstRides, nextRides, uncheckedNext, checkedFirst, otherDefinition int
	err = s.pool.QueryRow(ctx, `
		WITH r AS (
		    SELECT k.definition,
		           (SELECT count(*) FROM audit_records a
		            WHERE a.action = $3 AND a.resource_type = 'ride' AND a.resource_id = rides.id) AS checks
		    FROM rides JOIN idempotency_keys k ON k.id = rides.idempotency_key_id)
		SELECT count(*) FILTER (WHERE definition = $1),
		       count(*) FILTER (WHERE definition = $2),
		       count(*) FILTER (WHERE definition = $2 AND checks <> 1),
		       count(*) FILTER (WHERE definition = $1 AND checks <> 0),
		       count(*) FILTER (WHERE definition NOT IN ($1, $2))
		FROM r`, first.Definition(), next.Definition(), ride.FraudCheckPhase).
		Scan(&firstRides, &nextRides, &uncheckedNext, &checkedFirst, &otherDefinition)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("rolling deploy: %d rides under the first definition, %d under the checked one", firstRides, nextRides)
	return []check{
		{"rides of the checked definition not checked exactly once", uncheckedNext, 0},
		{"rides of the first definition checked", checkedFirst, 0},
		{"rides under neither definition", otherDefinition, 0},
		{"first definition served rides", min(firstRides, 1), 1},
		{"checked definition served rides", min(nextRides, 1), 1},
	}
}

// summary renders what happened in a test as a table.
func summary(c *chaosCounts, fo *failovers, out *workerOutage, st sim.Stats, settled settled, report ride.Report, checks []check, times timings) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(name string, v any) { fmt.Fprintf(tw, "  %s\t%v\n", name, v) }
	section := func(name string) { fmt.Fprintf(tw, "%s\t\n", name) }
	section("time")
	row("setup (cluster, migrations, processes)", times.setup.Round(100*time.Millisecond))
	row("traffic, to the last rider's answer", times.traffic.Round(100*time.Millisecond))
	row("settling", times.settle.Round(100*time.Millisecond))
	section("chaos")
	row("API processes killed (SIGKILL)", c.kills.Load())
	row("restarts that exited and were retried", c.failedStarts.Load())
	row("sessions terminated", c.terminated.Load())
	row("Postgres restarts", c.pgRestarts.Load())
	if c.pgRestarts.Load() > 0 {
		row("slowest API recovery after a restart", time.Duration(c.slowestRecovery.Load()).Round(10*time.Millisecond))
	}
	fo.summary(row)
	out.summary(row)
	section("riders")
	row("rides requested", st.Rides)
	row("  created (201)", st.Created)
	row("  declined (402)", st.Declined)
	row("  payment failed (502)", st.PaymentFailed)
	row("  given up on (left to the completer)", st.Abandoned)
	row("requests sent", st.Requests)
	row("  answered by their own run", st.Answered)
	row("  replayed answers", st.Replayed)
	row("  409s (retried)", st.Conflicts)
	row("  503s (retried)", st.Unavailable)
	row("  other 5xx (retried)", st.ServerErrors)
	row("  dropped by the rider (retried)", st.Dropped)
	row("  no answer (retried)", st.Lost)
	section("settling")
	row("keys finished by the final completer", settled.completed)
	row("final completer runs that failed", settled.failed)
	row("dead keys retried by the operator", settled.deadRetried)
	section("final state")
	row("keys finished", report.FinishedKeys)
	row("rides", report.Rides)
	row("created (201)", report.Created)
	row("declined (402)", report.Declined)
	row("receipts sent", report.Receipts)
	section("invariants")
	for _, ch := range checks {
		verdict := "ok"
		if ch.got != ch.want {
			verdict = fmt.Sprintf("FAIL (want %d)", ch.want)
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", ch.name, ch.got, verdict)
	}
	tw.Flush()
	return b.String()
}

// evidence logs the rows behind a failed invariant: keys left unfinished or
// locked, and rides with more than one charge at the fake Stripe.
func (s *system) evidence(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	rows, err := s.pool.Query(ctx, `
		SELECT tenant, idempotency_key, recovery_point, coalesce(hold, ''), attempts,
		       lock_token IS NOT NULL, coalesce(last_error, '')
		FROM idempotency_keys
		WHERE recovery_point <> 'finished' OR lock_token IS NOT NULL
		ORDER BY last_run_at LIMIT 50`)
	if err == nil {
		for rows.Next() {
			var tenant, key, rp, hold, lastErr string
			var attempts int
			var locked bool
			if err := rows.Scan(&tenant, &key, &rp, &hold, &attempts, &locked, &lastErr); err == nil {
				s.t.Logf("key %s/%s: recovery point %s, hold %q, attempts %d, locked %v, last error %q",
					tenant, key, rp, hold, attempts, locked, lastErr)
			}
		}
		rows.Close()
	} else {
		s.t.Logf("listing unfinished keys: %v", err)
	}
	rows, err = s.stripePool.Query(ctx, `
		SELECT customer, coalesce(metadata->>$1, ''), array_agg(id ORDER BY seq), array_agg(idempotency_key ORDER BY seq)
		FROM fakestripe_charges
		GROUP BY 1, 2 HAVING count(*) > 1`, ride.ChargeKeyMetadata)
	if err == nil {
		for rows.Next() {
			var customer, key string
			var charges, keys []string
			if err := rows.Scan(&customer, &key, &charges, &keys); err == nil {
				s.t.Logf("ride request %s of %s charged %d times: charges %v under Stripe keys %v", key, customer, len(charges), charges, keys)
			}
		}
		rows.Close()
	} else {
		s.t.Logf("listing rides charged twice: %v", err)
	}
}

// process is a rides subcommand running as a child of the test, which can
// be killed and started again on the same address.
type process struct {
	name string
	addr string
	bin  string
	args []string
	log  string

	mu  sync.Mutex
	run *instance // nil while not running
	// crashes counts instances that exited on their own after they had
	// started listening.
	crashes atomic.Int64
}

// instance is one run of a process.
type instance struct {
	cmd       *exec.Cmd
	done      chan struct{} // closed once cmd has exited and been reaped
	listening atomic.Bool
	killed    atomic.Bool
}

func (s *system) newProcess(bin, name, addr string, args ...string) *process {
	return &process{name: name, addr: addr, bin: bin, args: args, log: filepath.Join(s.logDir, name+".log")}
}

// start runs the process and returns once it accepts connections. A start
// fails when the process cannot reach Postgres (during a restart) or finds
// its port taken, and the process then exits; start tries again until
// startTimeout and reports how many tries exited.
func (p *process) start(ctx context.Context) (failed int, err error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		in, err := p.spawn()
		if err != nil {
			return failed, err
		}
		if p.waitListening(ctx, in) {
			return failed, nil
		}
		p.kill()
		if ctx.Err() != nil {
			return failed, fmt.Errorf("%s did not start listening on %s within %v; log %s:\n%s",
				p.name, p.addr, startTimeout, p.log, tail(p.log))
		}
		failed++
		sleep(ctx, 100*time.Millisecond)
	}
}

// spawn starts the process with its output appended to its log. The
// parent-death signal fires when the thread that forked the child exits,
// not the process, so the child is forked from a goroutine locked to its
// thread, which stays blocked in wait(2) until the child is reaped.
func (p *process) spawn() (*instance, error) {
	logFile, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== %s start %s\n", time.Now().Format(time.RFC3339Nano), p.name)
	in := &instance{cmd: exec.Command(p.bin, p.args...), done: make(chan struct{})}
	in.cmd.Stdout, in.cmd.Stderr = logFile, logFile
	in.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends the thread when this goroutine
		// returns, which is harmless once the child is reaped.
		runtime.LockOSThread()
		if err := in.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := in.cmd.Wait()
		if in.listening.Load() && !in.killed.Load() {
			p.crashes.Add(1)
			p.note("exited on its own: %v", err)
		}
		close(in.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", p.name, err)
	}
	p.mu.Lock()
	p.run = in
	p.mu.Unlock()
	return in, nil
}

// note appends a line to the process's log.
func (p *process) note(format string, args ...any) {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), p.name, fmt.Sprintf(format, args...))
}

// readyClient asks whether a process serves yet.
var readyClient = &http.Client{Timeout: 500 * time.Millisecond}

// waitListening polls the process's address until it answers HTTP, and
// reports false if the instance exits or ctx ends first. A process binds
// its address before it connects to Postgres, and answers once it serves.
func (p *process) waitListening(ctx context.Context, in *instance) bool {
	for {
		res, err := readyClient.Get("http://" + p.addr + "/_ready")
		if err == nil {
			res.Body.Close()
			in.listening.Store(true)
			return true
		}
		select {
		case <-in.done:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL and waits until the process is reaped. It does nothing
// when the process is not running.
func (p *process) kill() {
	p.mu.Lock()
	in := p.run
	p.run = nil
	p.mu.Unlock()
	if in == nil {
		return
	}
	in.killed.Store(true)
	_ = in.cmd.Process.Kill()
	<-in.done
}

// tail returns the end of the file at path.
func tail(path string) string {
	const max = 4 << 10
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// sleep waits for d and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
