//go:build linux

package chaos_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/examples/rides/fakestripe"
	"github.com/atomicphase/atomicphase/examples/rides/ride"
	"github.com/atomicphase/atomicphase/examples/rides/sim"
	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// failoverSoakEnv names the environment variable that turns the failover
// tests into a soak: a Go duration (10m) of traffic, during which the
// primary fails every 30 seconds.
const failoverSoakEnv = "ATOMICPHASE_FAILOVER_SOAK"

func TestFailoverSynchronous(t *testing.T) {
	t.Parallel()
	runChaos(t, scenario{traffic: 15 * time.Second, replication: synchronous})
}

func TestFailoverAsynchronous(t *testing.T) {
	t.Parallel()
	runChaos(t, scenario{traffic: 15 * time.Second, replication: asynchronous})
}

// replication is how a scenario's rides database is replicated.
type replication int

const (
	noReplication replication = iota
	// synchronous: every commit waits until the standby has flushed it.
	synchronous
	// asynchronous: commits return at once, and the standby follows as
	// fast as it can.
	asynchronous
)

// stripeDatabase starts creating a database for the fake Stripe, on the
// server every test uses, which never fails over, while the caller starts
// its primary and standby. The function it returns waits for the database,
// migrates it, and returns its DSN; the database is dropped when t ends.
func stripeDatabase(t *testing.T) func() string {
	type result struct {
		dsn  string
		drop func() error
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		dsn, drop, err := pgtest.NewDatabase(ctx, t.Name())
		ch <- result{dsn, drop, err}
	}()
	created := sync.OnceValue(func() result { return <-ch })
	t.Cleanup(func() {
		if r := created(); r.err == nil {
			if err := r.drop(); err != nil {
				t.Error(err)
			}
		}
	})
	return func() string {
		t.Helper()
		r := created()
		if r.err != nil {
			t.Fatal(r.err)
		}
		if err := fakestripe.Migrate(t.Context(), newPool(t, r.dsn)); err != nil {
			t.Fatal(err)
		}
		return r.dsn
	}
}

// replicated is a rides database on a primary with one streaming standby.
type replicated struct {
	primary, standby *pgcluster.Cluster
	// dsn reaches whichever of the two accepts writes.
	dsn string
}

// startReplicated starts a primary, migrates and seeds a rides database on
// it, and starts a standby that replicates it, synchronously when sync is
// true. Both are stopped when t ends.
func startReplicated(t *testing.T, sync bool) *replicated {
	t.Helper()
	ctx := t.Context()
	primary, err := pgcluster.StartPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := primary.Stop(); err != nil {
			t.Error(err)
		}
	})
	admin := newPool(t, primary.DSN("postgres"))
	if _, err := admin.Exec(ctx, "CREATE DATABASE rides"); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	pool := newPool(t, primary.DSN("rides"))
	if err := ride.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := ride.Seed(ctx, pool); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	standby := startStandby(t, primary, sync)
	return &replicated{primary: primary, standby: standby, dsn: pgcluster.MultiHostDSN("rides", primary, standby)}
}

// startStandby starts a streaming standby of primary, to which primary's
// commits are synchronous when sync is true: primary then acknowledges no
// commit the standby has not flushed. The standby is stopped when t ends.
func startStandby(t *testing.T, primary *pgcluster.Cluster, sync bool) *pgcluster.Cluster {
	t.Helper()
	standby, err := pgcluster.StartStandby(t.Context(), primary)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := standby.Stop(); err != nil {
			t.Error(err)
		}
	})
	if sync {
		if err := primary.SetSynchronous(t.Context(), true); err != nil {
			t.Fatal(err)
		}
	}
	return standby
}

// failOver kills the primary as a crash of its machine would and promotes
// the standby; the two then swap roles. It returns when the primary was
// dead.
func (r *replicated) failOver(ctx context.Context) (died time.Time, err error) {
	if err := r.primary.Kill(); err != nil {
		return time.Time{}, err
	}
	died = time.Now()
	if err := r.standby.Promote(ctx); err != nil {
		return died, err
	}
	r.primary, r.standby = r.standby, r.primary
	return died, nil
}

// TestFailoverRetryAfterLostCommitsChargesOnce fails over to an
// asynchronous standby that missed the last commits of two keys, and
// retries both as their clients would:
//
//   - behind: its ride was created before the standby was cut off, its
//     charge and 201 after. On the standby its recovery point is back at
//     ride_created; the retry charges again with the same Stripe key,
//     Stripe replays the charge, and the client gets the same 201 as
//     before.
//   - lost: its whole run came after. Its key row is gone, so the retry
//     starts over: a new ride row, and the same Stripe key, which the
//     charge parameters must match for Stripe to replay the charge rather
//     than refuse the request. The client gets a 201 for a new ride, and
//     the rider is charged once.
func TestFailoverRetryAfterLostCommitsChargesOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	stripeDSN := stripeDatabase(t)
	r := startReplicated(t, false)
	stripePool := newPool(t, stripeDSN())
	srv := httptest.NewServer(fakestripe.New(stripePool, fakestripe.Config{Logger: quiet}))
	t.Cleanup(srv.Close)
	sc := ride.NewStripeClient(srv.URL, stripeKey, nil)
	pool := newPool(t, r.dsn)

	beforeCharge := phase.Point{Phase: "charge_created", Stage: phase.BeforeCall}
	var crash atomic.Bool
	app, err := ride.New(ride.Config{
		Pool: pool, Stripe: sc, Logger: quiet, WithoutWorker: true,
		Client: phase.Config{
			LeaseTTL:  time.Second,
			Completer: recovery.CompleterConfig{Interval: -1},
			Reaper:    recovery.ReaperConfig{Interval: -1},
			Hooks: []phase.Hook{phase.InjectorFunc(func(_ context.Context, at phase.Point) error {
				if at == beforeCharge && crash.Load() {
					return phase.ErrCrash
				}
				return nil
			})},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(app.Handler())
	t.Cleanup(api.Close)
	post := func(key string) (int, string) {
		t.Helper()
		status, body, err := postRide(ctx, api.URL, ride.UserEmail, rideForm, key)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return status, body
	}

	crash.Store(true)
	// The crashed run answers nothing, as a killed process would.
	if status, body, err := sendRide(ctx, api.URL, ride.UserEmail, rideForm, "behind"); err == nil {
		t.Fatalf("behind: crashed run answered %d %s", status, body)
	}
	crash.Store(false)
	if err := r.standby.CatchUp(ctx, r.primary); err != nil {
		t.Fatal(err)
	}
	if err := r.standby.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	// From here on the primary commits alone.
	behindStatus, behindBody := post("behind")
	lostStatus, lostBody := post("lost")
	if behindStatus != http.StatusCreated || lostStatus != http.StatusCreated {
		t.Fatalf("before the failover: behind %d %s, lost %d %s", behindStatus, behindBody, lostStatus, lostBody)
	}
	before := chargesByKey(t, sc)

	if _, err := r.failOver(ctx); err != nil {
		t.Fatal(err)
	}
	// The pool's connections died with the primary; the first queries on
	// them would fail.
	pool.Reset()
	if row, err := app.Client.Inspect(ctx, ride.UserEmail, "behind"); err != nil || row.RecoveryPoint != "ride_created" {
		t.Fatalf("behind on the promoted standby: %+v, %v; want recovery point ride_created", row, err)
	}
	if _, err := app.Client.Inspect(ctx, ride.UserEmail, "lost"); !errors.Is(err, keyrow.ErrNotFound) {
		t.Fatalf("lost on the promoted standby: %v, want keyrow.ErrNotFound", err)
	}

	if status, body := post("behind"); status != behindStatus || body != behindBody {
		t.Errorf("behind after the failover: %d %s, want the answer from before it: %d %s", status, body, behindStatus, behindBody)
	}
	status, body := post("lost")
	if status != http.StatusCreated {
		t.Errorf("lost after the failover: %d %s, want 201", status, body)
	}
	t.Logf("lost: answered %s before the failover, %s after it", lostBody, body)

	after := chargesByKey(t, sc)
	for _, key := range []string{"behind", "lost"} {
		if len(after[key]) != 1 || len(before[key]) != 1 || after[key][0] != before[key][0] {
			t.Errorf("%s: charges %v before the failover, %v after it; want the same single charge", key, before[key], after[key])
		}
		var recorded string
		err := pool.QueryRow(ctx, `
			SELECT coalesce(r.stripe_charge_id, '') FROM rides r JOIN idempotency_keys k ON k.id = r.idempotency_key_id
			WHERE k.idempotency_key = $1`, key).Scan(&recorded)
		if err != nil || len(after[key]) == 0 || recorded != after[key][0] {
			t.Errorf("%s: ride records charge %q (%v), Stripe holds %v", key, recorded, err, after[key])
		}
	}
	report, err := ride.Verify(ctx, pool, sc, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if f := report.Failures(); len(f) > 0 || report.Charges != 2 || report.ChargedRides != 2 {
		t.Errorf("after the retries: %d charges, %d charged rides, failures %v; want 2, 2, none", report.Charges, report.ChargedRides, f)
	}
}

// chargesByKey returns the IDs of the charges at Stripe by the rides
// Idempotency-Key they were made for.
func chargesByKey(t *testing.T, sc *ride.Stripe) map[string][]string {
	t.Helper()
	charges, err := sc.Charges(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, ch := range charges {
		key := ch.Metadata[ride.ChargeKeyMetadata]
		out[key] = append(out[key], ch.ID)
	}
	return out
}

// failoverEvery is the time between failovers in a soak.
const failoverEvery = 30 * time.Second

// cutOffBefore is how long before the primary's death every other
// failover of an asynchronous scenario cuts the standby off its primary
// (pgcluster.Cluster.Detach), as a standby that falls behind would be, so
// that the failover loses what was committed meanwhile, for certain. The
// other failovers find the standby streaming, as close behind as one
// machine allows.
const cutOffBefore = time.Second

// failOvers fails the primary over to the standby twice, with a third of
// the traffic's duration before, between and after the failovers, or
// every failoverEvery for the traffic's duration when it is longer than
// two minutes. After each failover but the last it rebuilds the dead
// primary as the standby of the new one (and makes replication synchronous
// again in a synchronous scenario), so there is a standby to fail over to.
func (s *system) failOvers(ctx context.Context, sc scenario, fo *failovers) {
	every, n := sc.traffic/3, 2
	if sc.traffic > 2*time.Minute {
		every, n = failoverEvery, int(sc.traffic/failoverEvery)-1
	}
	for i := 1; i <= n && sleep(ctx, every); i++ {
		cutOff := sc.replication == asynchronous && i%2 == 0
		if err := s.failOver(ctx, sc, cutOff, i < n, fo); err != nil {
			s.t.Error(err)
			return
		}
	}
	sleep(ctx, every)
}

// failOver kills the primary, promotes the standby, counts the
// acknowledged rides the promoted standby lacks, waits for every API
// process to serve a ride again, and with rebuild, rebuilds the dead
// primary as the new standby. With cutOff, it first cuts the standby off
// and lets the primary commit alone for cutOffBefore.
func (s *system) failOver(ctx context.Context, sc scenario, cutOff, rebuild bool, fo *failovers) error {
	r := s.replicated
	var rec failover
	if cutOff {
		if err := r.standby.Detach(ctx); err != nil {
			return err
		}
		rec.cutOff = cutOffBefore
		sleep(ctx, cutOffBefore)
	}
	served := fo.mark()
	killed, err := r.failOver(ctx)
	if err != nil {
		return err
	}
	rec.promoted = time.Since(killed)
	// The test's own connections died with the primary.
	s.pool.Reset()
	if err := fo.countLost(ctx, r.dsn, &rec); err != nil {
		return err
	}
	var waitErr error
	rec.firstRide, waitErr = fo.waitServed(ctx, served, killed)
	fo.record(rec)
	if waitErr != nil {
		s.t.Error(waitErr)
	}
	if !rebuild {
		return nil
	}
	if err := r.standby.Rebuild(ctx, r.primary); err != nil {
		return err
	}
	if sc.replication == synchronous {
		if err := r.primary.SetSynchronous(ctx, true); err != nil {
			return err
		}
	}
	return nil
}

// failover is what one failover did.
type failover struct {
	// cutOff is how long before the primary's death the standby was cut
	// off, or zero.
	cutOff time.Duration
	// promoted is the time from the primary's death to the promoted
	// standby accepting writes; firstRide, to the first 201 answered to a
	// request sent after the death, or zero if none came.
	promoted, firstRide time.Duration
	// Of the rides acknowledged (201) before the failover, those the
	// promoted standby lacks: keyLost with their key row, rideLost with
	// the key row left at started, and recreated by a copy of the request
	// still retrying as the standby took over, which created another ride
	// before the failover was counted. movedBack counts the acknowledged
	// rides kept without their stored answer: the recovery point moved
	// back, and the next run or the completer finishes the key again.
	keyLost, rideLost, recreated, movedBack int
}

// failovers records what riders were answered and what each failover did
// to the rides they had been answered.
type failovers struct {
	apis int // API processes that must serve again after a failover

	mu sync.Mutex
	// first holds each key's first answer, for its request; final its
	// first final answer (201, 402, 502); changed the later final answers
	// that differed from it.
	first   map[string]sim.Answer
	final   map[string]string
	changed map[string][]string
	// created lists the 201 answers in the order received; acked holds
	// the ride ID of each key's first 201.
	created []sim.Answer
	acked   map[string]int64
	// lost holds the keys whose acknowledged ride a failover lost.
	lost map[string]bool
	// done lists the failovers; unserved counts those after which some API
	// process served no ride within recoverTimeout.
	done     []failover
	unserved int

	// Written by retryLost: lost rides created again by a copy of the
	// request still retrying at the failover; retried by their rider
	// afterwards, those of them answered 201, and those answered the
	// very answer they had before the failover.
	recreated, retried, retriedCreated, retriedSame int
}

func newFailovers(apis int) *failovers {
	return &failovers{apis: apis, first: map[string]sim.Answer{}, final: map[string]string{},
		changed: map[string][]string{}, acked: map[string]int64{}, lost: map[string]bool{}}
}

// observe records an answer a rider got.
func (f *failovers) observe(a sim.Answer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.first[a.Key]; !ok {
		f.first[a.Key] = a
	}
	switch a.Status {
	case http.StatusCreated, http.StatusPaymentRequired, http.StatusBadGateway:
		got := strconv.Itoa(a.Status) + " " + a.Body
		if first, ok := f.final[a.Key]; !ok {
			f.final[a.Key] = got
		} else if got != first {
			f.changed[a.Key] = append(f.changed[a.Key], got)
		}
	}
	if a.Status == http.StatusCreated {
		if _, ok := f.acked[a.Key]; !ok {
			var created ride.Created
			_ = json.Unmarshal([]byte(a.Body), &created)
			f.acked[a.Key] = created.RideID
		}
		a.Form, a.Body = "", ""
		f.created = append(f.created, a)
	}
}

// explained is how many final answers differed from their key's first
// because a failover lost the ride of that first answer.
func (f *failovers) explained() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for key, changed := range f.changed {
		if f.lost[key] {
			n += len(changed)
		}
	}
	return n
}

// unexplained describes the keys answered two different final responses
// that explained does not account for.
func (f *failovers) unexplained() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for key, changed := range f.changed {
		if !f.lost[key] {
			out = append(out, fmt.Sprintf("key %s: answered %s, then %v", key, f.final[key], changed))
		}
	}
	return out
}

// mark returns how many 201s riders have been answered so far.
func (f *failovers) mark() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.created)
}

func (f *failovers) record(rec failover) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.done = append(f.done, rec)
	if rec.firstRide == 0 {
		f.unserved++
	}
}

// lostRides is how many acknowledged rides the failovers lost.
func (f *failovers) lostRides() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.lost)
}

// countLost checks every ride acknowledged so far against the promoted
// standby, which dsn now reaches, and counts the losses in rec. A ride is
// lost when the key it was acknowledged for no longer has it, by its ID:
// API processes reach the promoted standby before the count does, and a
// copy of a lost request may have created another ride meanwhile.
func (f *failovers) countLost(ctx context.Context, dsn string, rec *failover) error {
	f.mu.Lock()
	var keys []string
	for key := range f.acked {
		if !f.lost[key] {
			keys = append(keys, key)
		}
	}
	f.mu.Unlock()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `
		SELECT k.idempotency_key, k.recovery_point, coalesce(r.id, 0)
		FROM idempotency_keys k LEFT JOIN rides r ON r.tenant = k.tenant AND r.idempotency_key_id = k.id
		WHERE k.idempotency_key = ANY($1)`, keys)
	if err != nil {
		return err
	}
	type kept struct {
		recoveryPoint string
		ride          int64
	}
	found := map[string]kept{}
	for rows.Next() {
		var key string
		var k kept
		if err := rows.Scan(&key, &k.recoveryPoint, &k.ride); err != nil {
			return err
		}
		found[key] = k
	}
	if err := rows.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, key := range keys {
		k, ok := found[key]
		switch {
		case !ok:
			rec.keyLost++
		case k.ride == 0:
			rec.rideLost++
		case k.ride != f.acked[key]:
			rec.recreated++
		case k.recoveryPoint != keyrow.Finished:
			rec.movedBack++
			continue
		default:
			continue
		}
		f.lost[key] = true
	}
	return nil
}

// waitServed waits until every API process has answered 201 to a request
// sent after killed, among the 201s from mark on, and returns how long
// after killed the first such 201 came, or zero if none came within
// recoverTimeout.
func (f *failovers) waitServed(ctx context.Context, mark int, killed time.Time) (time.Duration, error) {
	deadline := time.Now().Add(recoverTimeout)
	for {
		f.mu.Lock()
		var first time.Time
		served := map[string]bool{}
		for _, a := range f.created[mark:] {
			if a.Sent.Before(killed) {
				continue
			}
			served[a.API] = true
			if first.IsZero() || a.Received.Before(first) {
				first = a.Received
			}
		}
		f.mu.Unlock()
		if len(served) == f.apis {
			return first.Sub(killed), nil
		}
		if time.Now().After(deadline) || !sleep(ctx, 20*time.Millisecond) {
			return 0, fmt.Errorf("within %v of a failover, only %d of %d API processes served a ride", recoverTimeout, len(served), f.apis)
		}
	}
}

// retryLost sends again, as its rider would, every acknowledged ride a
// failover lost and nothing has created again since, and returns the
// final report.
func (s *system) retryLost(ctx context.Context, f *failovers) (ride.Report, error) {
	var keys []string
	for key := range f.lost {
		keys = append(keys, key)
	}
	rows, err := s.pool.Query(ctx, `
		SELECT k.idempotency_key FROM idempotency_keys k JOIN rides r ON r.tenant = k.tenant AND r.idempotency_key_id = k.id
		WHERE k.idempotency_key = ANY($1)`, keys)
	if err != nil {
		return ride.Report{}, err
	}
	recreated, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return ride.Report{}, err
	}
	f.recreated = len(recreated)
	for _, key := range keys {
		if slices.Contains(recreated, key) {
			continue
		}
		a := f.first[key]
		status, body, err := postRide(ctx, "http://"+s.apis[rand.IntN(len(s.apis))].addr, a.Rider, a.Form, key)
		if err != nil {
			return ride.Report{}, fmt.Errorf("retrying lost ride %s: %w", key, err)
		}
		f.retried++
		if status == http.StatusCreated {
			f.retriedCreated++
		}
		if strconv.Itoa(status)+" "+body == f.final[key] {
			f.retriedSame++
		}
		if f.retried <= 3 {
			s.t.Logf("lost ride %s: answered %s before the failover, %d %s when retried", key, f.final[key], status, body)
		}
	}
	return ride.Verify(ctx, s.pool, s.stripeClient(), time.Time{})
}

// checks are the invariants of a scenario with replication.
func (f *failovers) checks(sc scenario) []check {
	want := 2
	if sc.citus {
		want = 1 // the killed worker's
	}
	out := []check{{"failovers", min(len(f.done), want), want}}
	if !sc.citus {
		// On Citus the outage's checks say when the killed worker's
		// riders were served again; the others were served throughout.
		out = append(out, check{"failovers after which an API process served no ride", f.unserved, 0})
	}
	out = append(out, check{"lost rides not created again by their retry", f.retried - f.retriedCreated, 0})
	if sc.replication == synchronous {
		out = append(out, check{"acknowledged rides lost in a failover", len(f.lost), 0})
	}
	return out
}

// summary adds the failover rows to a test's summary.
func (f *failovers) summary(row func(name string, v any)) {
	if len(f.done) == 0 {
		return
	}
	for i, rec := range f.done {
		name := fmt.Sprintf("failover %d", i+1)
		if rec.cutOff > 0 {
			name += fmt.Sprintf(", standby cut off %v before", rec.cutOff)
		}
		row(name, fmt.Sprintf("promoted %v, first 201 %v after the primary's death; acknowledged rides lost %d "+
			"(key row gone %d, ride gone %d, already created again %d), answers lost with the ride kept %d",
			rec.promoted.Round(10*time.Millisecond), rec.firstRide.Round(10*time.Millisecond),
			rec.keyLost+rec.rideLost+rec.recreated, rec.keyLost, rec.rideLost, rec.recreated, rec.movedBack))
	}
	row("lost rides created again by a copy still retrying, by the end", f.recreated)
	row("lost rides retried afterwards by their rider", f.retried)
	row("  of which answered 201", f.retriedCreated)
	row("  of which answered exactly as before", f.retriedSame)
}
