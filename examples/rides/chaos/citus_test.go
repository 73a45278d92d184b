//go:build linux

package chaos_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/internal/testenv"
)

// TestChaosCitusWorkerKilledMidCharge runs two API processes on the
// coordinator of a Citus cluster of its own, the rides tables distributed by
// tenant (rides serve -citus), and kills the worker node that holds the
// busiest rider's keys while some of its riders' charges are in flight, as
// a crash of that node's machine would (SIGKILL of its postmaster and every
// backend), then starts it again. No ride may be charged twice or lost,
// every key must be finished, riders on the other worker must be served
// while the node is down, and the killed node's riders must be served again
// soon after it is back.
func TestChaosCitusWorkerKilledMidCharge(t *testing.T) {
	t.Parallel()
	runChaos(t, scenario{traffic: 30 * time.Second, citus: true})
}

// TestChaosCitusWorkerFailover is TestChaosCitusWorkerKilledMidCharge with a
// synchronous streaming standby of the worker that is killed, which is not
// started again: its standby is promoted and the coordinator pointed at it
// (citus_update_node), as an operator does. Besides the invariants of the
// kill, no acknowledged ride may be lost, and no prepared transaction may
// be left on the promoted standby.
func TestChaosCitusWorkerFailover(t *testing.T) {
	t.Parallel()
	runChaos(t, scenario{traffic: 30 * time.Second, citus: true, replication: synchronous})
}

const (
	// citusAPIProcesses is how many `rides serve -citus` processes share
	// the coordinator.
	citusAPIProcesses = 2
	// citusFaultPlan slows every charge down, so that charges are in flight
	// when the worker dies, and fails none: every failed answer a rider
	// gets is the outage's.
	citusFaultPlan = `{"delay_ms": 50}`
	// workerDownFor is how long the killed worker stays down before it is
	// started again or fails over.
	workerDownFor = 5 * time.Second
	// killAfter is how long the riders ride before the worker may be killed.
	killAfter = 5 * time.Second
	// probeEvery is how often, around the outage, a new ride is sent once,
	// without retries, for a rider of each worker.
	probeEvery = 200 * time.Millisecond
)

// citusRides is the rides database on a Citus cluster of a coordinator and
// two workers, distributed with ride.Distribute.
type citusRides struct {
	cluster *pgcluster.Citus
	dsn     string
	// riders are the riders of the simulation, the first the busiest;
	// victims are those whose keys the worker that killWorker kills holds
	// (riders[0] among them), survivors the others.
	riders, victims, survivors []string
	victim                     *pgcluster.Cluster
	// standby is the victim's streaming standby, or nil: with one,
	// killWorker fails the victim over to it instead of starting it again.
	standby *pgcluster.Cluster
}

// startCitusRides starts the cluster, distributes and seeds the rides
// database on it with riders on both workers, and stops the cluster when t
// ends. With replication the worker that holds the busiest rider's keys
// gets a streaming standby, to which its commits are synchronous or not.
// Without the citus extension t is skipped.
func startCitusRides(t *testing.T, rep replication) *citusRides {
	t.Helper()
	if err := pgcluster.CitusInstalled(); err != nil {
		testenv.SkipWithout(t, "citus", err)
	}
	ctx := t.Context()
	// Commits wait for their WAL to reach the kernel, so that killing a
	// node's processes loses no commit it acknowledged, as a durable
	// database's crash would not. With commits asynchronous (the harness's
	// default) the WAL still in the killed node's buffers is lost, commits
	// that runs had already built on among it, and one run counted a
	// charge at Stripe that no ride recorded.
	c, err := pgcluster.StartCitus(ctx, 2, "citus.shard_count=8", "synchronous_commit=on")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	cr := &citusRides{cluster: c, dsn: c.Coordinator.DSN("postgres")}
	pool := newPool(t, cr.dsn)
	defer pool.Close()
	if err := ride.Distribute(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := ride.Seed(ctx, pool); err != nil {
		t.Fatal(err)
	}
	cr.riders = []string{ride.UserEmail, ride.DeclinedEmail}
	for i := range 8 {
		cr.riders = append(cr.riders, fmt.Sprintf("rider%d@example.com", i))
	}
	_, err = pool.Exec(ctx, `INSERT INTO users (email, stripe_customer_id) SELECT unnest($1::text[]), $2
		ON CONFLICT (email) DO NOTHING`, cr.riders[2:], ride.UserCustomer)
	if err != nil {
		t.Fatal(err)
	}
	workers := map[string]*pgcluster.Cluster{}
	for _, w := range c.Workers {
		cfg, err := pgconn.ParseConfig(w.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		workers[cfg.Host] = w
	}
	holder := map[string]*pgcluster.Cluster{}
	for _, r := range cr.riders {
		var node string
		err := pool.QueryRow(ctx, `SELECT nodename FROM pg_dist_shard_placement
			WHERE shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)`, r).Scan(&node)
		if err != nil {
			t.Fatal(err)
		}
		if holder[r] = workers[node]; holder[r] == nil {
			t.Fatalf("rider %s's keys are on %s, not on a worker", r, node)
		}
	}
	cr.victim = holder[cr.riders[0]]
	for _, r := range cr.riders {
		if holder[r] == cr.victim {
			cr.victims = append(cr.victims, r)
		} else {
			cr.survivors = append(cr.survivors, r)
		}
	}
	if len(cr.survivors) == 0 {
		t.Fatalf("every rider's keys are on one worker: %v", cr.riders)
	}
	if rep != noReplication {
		// Once failed over, the victim is no longer one of the cluster's
		// workers, which the cluster's Stop stops.
		t.Cleanup(func() {
			if err := cr.victim.Stop(); err != nil {
				t.Error(err)
			}
		})
		cr.standby = startStandby(t, cr.victim, rep == synchronous)
	}
	return cr
}

// workerOutage is what killWorker did and what the probes sent around it
// were answered.
type workerOutage struct {
	ran bool
	// failover is set when the worker failed over to its standby rather
	// than being started again.
	failover bool
	// inFlight is how many of the victims' keys were held past
	// ride_created (their charge under way) when the worker was killed.
	inFlight int
	// down is from the kill to the victims' shards being reachable again:
	// the restarted worker accepting connections, or the coordinator
	// pointed at the promoted standby. restart is how long starting the
	// worker again took; promote and update how long promoting the standby
	// and citus_update_node took.
	down, restart, promote, update time.Duration
	// prepared is how many prepared transactions the promoted standby
	// held, left by two-phase commits the kill cut short; recovered how
	// many of them recover_prepared_transactions then finished, and left
	// how many were still there once the riders were done.
	prepared, recovered, left int
	// victimBack is from the victims' shards being reachable again to
	// the first 201 of a probe for a victim sent after it; zero if none
	// came within recoverTimeout.
	victimBack time.Duration
	// apiRestart is how long an API process killed and started again
	// while the worker was down took to listen, apiFailedStarts how many of
	// its starts exited meanwhile, and apiServed whether it then served a
	// survivor's ride before the worker was back.
	apiRestart      time.Duration
	apiFailedStarts int
	apiServed       bool

	mu     sync.Mutex
	probes []probe
}

// probe is one ride request sent once, without retries.
type probe struct {
	victim     bool
	sent, took time.Duration // since the kill (negative before), and to the answer
	answer     string        // "201", "503 Retry-After: 1", "no answer: ..."
}

// killWorker waits until a charge of a victim's key is in flight, kills the
// victims' worker, after workerDownFor starts it again or fails it over to
// its standby (recording the failover in fo), and probes both workers'
// riders from before the kill until the victims are served again.
func (s *system) killWorker(ctx context.Context, out *workerOutage, fo *failovers) {
	cr := s.citus
	out.ran = true
	if !sleep(ctx, killAfter) {
		return
	}
	for {
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys
			WHERE tenant = ANY($1) AND recovery_point = 'ride_created' AND lock_token IS NOT NULL`, cr.victims).Scan(&out.inFlight)
		if err == nil && out.inFlight > 0 {
			break
		}
		if !sleep(ctx, 5*time.Millisecond) {
			s.t.Error("no charge of the killed worker's riders was ever in flight")
			return
		}
	}
	ctx = context.WithoutCancel(ctx)
	killed := time.Now()
	probing, stopProbes := context.WithCancel(ctx)
	var probes sync.WaitGroup
	probes.Go(func() { out.probe(probing, s, killed) })
	defer func() {
		stopProbes()
		probes.Wait()
	}()
	if err := cr.victim.Kill(); err != nil {
		s.t.Error(err)
		return
	}
	var apiDone sync.WaitGroup
	apiDone.Go(func() { out.restartAPI(ctx, s) })
	sleep(ctx, workerDownFor)
	apiDone.Wait()
	var rec failover
	if cr.standby == nil {
		restarting := time.Now()
		if err := cr.victim.Restart(ctx); err != nil {
			s.t.Error(err)
			return
		}
		out.restart = time.Since(restarting)
		out.down = time.Since(killed)
	} else {
		var err error
		if rec, err = s.failOverWorker(ctx, out, fo, killed); err != nil {
			s.t.Error(err)
			return
		}
		defer func() { fo.record(rec) }()
	}
	deadline := killed.Add(out.down + recoverTimeout)
	for time.Now().Before(deadline) && sleep(ctx, 20*time.Millisecond) {
		if d := out.firstVictim201(out.down); d > 0 {
			out.victimBack = d
			rec.firstRide = out.down + d
			sleep(ctx, time.Second) // a few probes more, to show the answers after
			return
		}
	}
}

// failOverWorker does what an operator does when a worker with a standby
// fails: it promotes the killed victim's standby, points the coordinator
// at it, and has Citus finish the two-phase commits the kill cut short.
// It counts in the failover it returns the acknowledged rides the standby
// lacks.
func (s *system) failOverWorker(ctx context.Context, out *workerOutage, fo *failovers, killed time.Time) (failover, error) {
	cr := s.citus
	out.failover = true
	var rec failover
	promoting := time.Now()
	if err := cr.standby.Promote(ctx); err != nil {
		return rec, err
	}
	promoted := time.Now()
	out.promote, rec.promoted = promoted.Sub(promoting), promoted.Sub(killed)
	if err := s.preparedOnStandby(ctx, &out.prepared); err != nil {
		return rec, err
	}
	updating := time.Now()
	if err := cr.cluster.ReplaceWorker(ctx, cr.victim, cr.standby); err != nil {
		return rec, err
	}
	out.update = time.Since(updating)
	out.down = time.Since(killed)
	// A prepared transaction holds its rows' locks until it is committed
	// or rolled back; Citus's maintenance daemon would recover it only
	// within citus.recover_2pc_interval, a minute by default.
	if err := s.pool.QueryRow(ctx, "SELECT recover_prepared_transactions()").Scan(&out.recovered); err != nil {
		return rec, err
	}
	return rec, fo.countLost(ctx, cr.dsn, &rec)
}

// preparedOnStandby counts the prepared transactions on the victim's
// standby.
func (s *system) preparedOnStandby(ctx context.Context, n *int) error {
	conn, err := pgx.Connect(ctx, s.citus.standby.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts").Scan(n)
}

// restartAPI kills the second API process, as a deploy or a crash would
// while the worker is down, starts it again, and has it serve a survivor's
// ride.
func (o *workerOutage) restartAPI(ctx context.Context, s *system) {
	sleep(ctx, time.Second)
	p := s.apis[1]
	p.kill()
	began := time.Now()
	failed, err := p.start(ctx)
	o.apiRestart, o.apiFailedStarts = time.Since(began), failed
	if err != nil {
		s.t.Error(err)
		return
	}
	status, body, err := postRide(ctx, "http://"+p.addr, s.citus.survivors[0], rideForm, "citus-restarted-api")
	if err != nil || status != http.StatusCreated {
		s.t.Errorf("%s restarted while a worker was down: ride answered %d %s, %v", p.name, status, body, err)
		return
	}
	o.apiServed = true
}

// probe sends a new ride for a victim and one for a survivor every
// probeEvery until ctx ends, each once, and records the answers.
func (o *workerOutage) probe(ctx context.Context, s *system, killed time.Time) {
	client := &http.Client{Timeout: 10 * time.Second}
	var n atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; sleep(ctx, probeEvery); i++ {
		for _, victim := range []bool{true, false} {
			riders := s.citus.survivors
			if victim {
				riders = s.citus.victims
			}
			rider := riders[i%len(riders)]
			// The first API process, never restarted: restartAPI restarts
			// the second.
			api := "http://" + s.apis[0].addr
			key := fmt.Sprintf("citus-probe-%d", n.Add(1))
			wg.Go(func() {
				sent := time.Now()
				answer := "no answer"
				req, err := rideRequest(context.WithoutCancel(ctx), api, rider, rideForm, key)
				if err == nil {
					var res *http.Response
					if res, err = client.Do(req); err == nil {
						res.Body.Close()
						answer = fmt.Sprint(res.StatusCode)
						if ra := res.Header.Get("Retry-After"); ra != "" {
							answer += " Retry-After: " + ra
						}
					}
				}
				if err != nil {
					answer = "no answer: " + shortError(err)
				}
				o.mu.Lock()
				defer o.mu.Unlock()
				o.probes = append(o.probes, probe{victim: victim, sent: sent.Sub(killed), took: time.Since(sent), answer: answer})
			})
		}
	}
}

// shortError names the kind of a client error, without addresses or keys.
func shortError(err error) string {
	switch msg := err.Error(); {
	case strings.Contains(msg, "Client.Timeout"), strings.Contains(msg, "deadline exceeded"):
		return "timeout"
	case strings.Contains(msg, "EOF"), strings.Contains(msg, "reset"):
		return "connection closed"
	default:
		return msg
	}
}

// firstVictim201 returns how long after from (since the kill) the first
// 201 to a victim's probe sent after from came, or zero.
func (o *workerOutage) firstVictim201(from time.Duration) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	var first time.Duration
	for _, p := range o.probes {
		if p.victim && p.sent >= from && p.answer == "201" {
			if at := p.sent + p.took - from; first == 0 || at < first {
				first = at
			}
		}
	}
	return first
}

// answers counts the answers to the victims' (or the survivors') probes
// sent within [from, to) of the kill, and returns them rendered, with the
// slowest answer's time.
func (o *workerOutage) answers(victim bool, from, to time.Duration) (string, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	counts := map[string]int{}
	var slowest time.Duration
	var created int
	for _, p := range o.probes {
		if p.victim != victim || p.sent < from || p.sent >= to {
			continue
		}
		counts[p.answer]++
		slowest = max(slowest, p.took)
		if p.answer == "201" {
			created++
		}
	}
	if len(counts) == 0 {
		return "none sent", 0
	}
	var parts []string
	for _, a := range slices.SortedFunc(maps.Keys(counts), func(a, b string) int { return cmp.Compare(counts[b], counts[a]) }) {
		parts = append(parts, fmt.Sprintf("%d× %s", counts[a], a))
	}
	return fmt.Sprintf("%s (slowest %v)", strings.Join(parts, ", "), slowest.Round(time.Millisecond)), created
}

// back names how the killed worker's shards came back.
func (o *workerOutage) back() string {
	if o.failover {
		return "its failover"
	}
	return "its restart"
}

// checks are the invariants of the outage.
func (o *workerOutage) checks() []check {
	_, survivorsServed := o.answers(false, 0, o.down)
	served := 0
	if o.apiServed {
		served = 1
	}
	out := []check{
		{"killed worker's riders served again within " + recoverTimeout.String() + " of " + o.back(), min(int(o.victimBack), 1), 1},
		{"other worker's riders served while it was down", min(survivorsServed, 1), 1},
		{"API starts that exited while the worker was down", o.apiFailedStarts, 0},
		{"API restarted while the worker was down serving", served, 1},
	}
	if o.failover {
		out = append(out, check{"prepared transactions left on the promoted standby", o.left, 0})
	}
	return out
}

// summary adds the outage's rows to a test's summary.
func (o *workerOutage) summary(row func(name string, v any)) {
	if !o.ran {
		return
	}
	round := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	row("worker killed with its riders' charges in flight", o.inFlight)
	if o.failover {
		row("worker down (kill to the coordinator reaching its promoted standby)", round(o.down))
		row("  of which its standby's promotion", round(o.promote))
		row("  of which citus_update_node", round(o.update))
		row("prepared transactions on the promoted standby", o.prepared)
		row("  finished by recover_prepared_transactions", o.recovered)
		row("  left once the riders were done", o.left)
	} else {
		row("worker down (kill to accepting connections)", round(o.down))
		row("  of which its restart", round(o.restart))
	}
	victims, _ := o.answers(true, 0, o.down)
	survivors, _ := o.answers(false, 0, o.down)
	row("probes for its riders while it was down", victims)
	row("probes for the other worker's riders meanwhile", survivors)
	after, _ := o.answers(true, o.down, o.down+recoverTimeout)
	row("probes for its riders after "+o.back(), after)
	row("first 201 for its riders after "+o.back(), round(o.victimBack))
	row("API process restarted while it was down: listening after", round(o.apiRestart))
}
