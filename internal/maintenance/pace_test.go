package maintenance

import (
	"errors"
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/recovery"
)

// The pace is arithmetic on pass results; the passes themselves are tested
// against Postgres in package recovery.
func TestPaceFollowsThePasses(t *testing.T) {
	t.Parallel()
	cfg, err := recovery.CompleterConfig{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	p := newPace(cfg, 90*time.Second)
	if claim, running := p.plan(); claim != 4 || running != 4 {
		t.Errorf("the first pass claims %d and runs %d at once; want Concurrency, 4, and 4: it knows no rate yet", claim, running)
	}
	step := func(name string, asked int, res recovery.PassResult, took time.Duration, fresh bool, err error, wantWait time.Duration, wantClaim, wantRunning int) {
		t.Helper()
		wait := p.record(asked, res, took, fresh, err)
		claim, running := p.plan()
		if wait != wantWait || claim != wantClaim || running != wantRunning {
			t.Errorf("%s: pause %s, next pass claims %d and runs %d at once; want %s, %d, %d",
				name, wait, claim, running, wantWait, wantClaim, wantRunning)
		}
	}
	full := recovery.PassResult{Claimed: 100, Completed: 100}
	step("a first pass", 4, recovery.PassResult{Claimed: 4, Completed: 4}, 40*time.Millisecond, true, nil, 0, 100, 4)
	step("a full batch", 100, full, time.Second, true, nil, 0, 100, 4)
	step("a partial batch", 100, recovery.PassResult{Claimed: 7, Completed: 7}, 50*time.Millisecond, true, nil, 0, 100, 4)
	step("an empty pass", 100, recovery.PassResult{}, time.Millisecond, false, nil, cfg.Interval, 100, 4)
	handedBack := recovery.PassResult{Claimed: 100, HandedBack: 100}
	step("a batch of keys handed back, new to the streak", 100, handedBack, time.Second, true, nil, 0, 100, 4)
	step("a batch of keys the streak handed back already", 100, handedBack, time.Second, false, nil, cfg.Interval, 100, 4)
	// 100 keys in 100 s: 45 of them finish in half a 90 s lease.
	step("slow keys", 100, full, 100*time.Second, true, nil, 0, 45, 4)
	failing := recovery.PassResult{Claimed: 45, Completed: 5, Failed: 40}
	step("keys mostly failing", 45, failing, 9*time.Second, true, nil, cfg.Interval, 2, 2)
	step("failing again", 2, recovery.PassResult{Claimed: 2, Failed: 2}, 9*time.Second, true, nil, 2*cfg.Interval, 1, 1)
	store := errors.New("connection refused")
	for range 5 {
		p.record(1, recovery.PassResult{}, time.Millisecond, false, store)
	}
	step("the store down for long", 1, recovery.PassResult{}, time.Millisecond, false, store, maxPause, 1, 1)
	step("recovered", 1, recovery.PassResult{Claimed: 1, Completed: 1}, 25*time.Millisecond, true, nil, 0, 100, 2)
	step("recovered further", 100, full, time.Second, true, nil, 0, 100, 3)
	step("recovered fully", 100, full, time.Second, true, nil, 0, 100, 4)

	// Keys' own times, their calls left out: 2 ms at best, then a busy
	// store at 4 ms, more than 1.5 times the best.
	own := func(d time.Duration) []time.Duration { return []time.Duration{d / 2, d, d, d * 10} }
	p.observe(own(2 * time.Millisecond))
	step("a quick store", 100, full, time.Second, true, nil, 0, 100, 4)
	for _, want := range []int{3, 2, 1, 1} {
		p.observe(own(4 * time.Millisecond))
		step("a busy store", 100, full, time.Second, true, nil, 0, 100, want)
	}
	p.observe(own(2500 * time.Microsecond))
	step("a store quick again", 100, full, time.Second, true, nil, 0, 100, 2)
	// A pass without keys of its own judges nothing.
	p.observe(own(4 * time.Millisecond))
	p.record(100, full, time.Second, true, nil)
	step("an empty pass after a busy one", 100, recovery.PassResult{}, time.Second, false, nil, cfg.Interval, 100, 2)
}

// The completer yields when more than one in a hundred live runs during a
// drain take over 1.5 times the p99 of those seen while it was idle, and
// only then: the promise that their p99 stays within 1.5 times it.
func TestPaceYieldsToSlowedLiveRuns(t *testing.T) {
	t.Parallel()
	cfg, err := recovery.CompleterConfig{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	c := NewCompleter(cfg, nil, nil, nil, nil, 90*time.Second, nil)
	p, live := c.pace, &c.Live
	full := recovery.PassResult{Claimed: 100, Completed: 100}
	pass := func(name string, runs []time.Duration, wantRunning int) {
		t.Helper()
		for _, d := range runs {
			live.Record(time.Now(), d)
		}
		p.record(100, full, time.Second, true, nil)
		if _, running := p.plan(); running != wantRunning {
			t.Errorf("%s: the next pass runs %d keys at once, want %d", name, running, wantRunning)
		}
	}
	runs := func(n int, d time.Duration, slow int, slowD time.Duration) []time.Duration {
		r := make([]time.Duration, 0, n)
		for i := range n {
			if i < slow {
				r = append(r, slowD)
			} else {
				r = append(r, d)
			}
		}
		return r
	}

	// Idle: 1000 runs, their p99 10 ms, so the line is at 15 ms.
	for _, d := range runs(1000, 2*time.Millisecond, 20, 10*time.Millisecond) {
		live.Record(time.Now(), d)
	}
	live.drain(true)
	pass("one run in a hundred past the line", runs(100, 3*time.Millisecond, 1, 16*time.Millisecond), 4)
	pass("two in a hundred", runs(100, 3*time.Millisecond, 2, 16*time.Millisecond), 3)
	pass("too few runs to tell, one past the line: the pace holds", runs(50, 3*time.Millisecond, 1, 20*time.Millisecond), 3)
	pass("with the runs carried over, two in 100", runs(50, 3*time.Millisecond, 1, 20*time.Millisecond), 2)
	pass("all slower, none past the line", runs(100, 14*time.Millisecond, 0, 0), 3)
	pass("no live run since, lately: the pace holds", nil, 3)
	live.mu.Lock()
	live.last = time.Now().Add(-liveQuiet - time.Second)
	live.mu.Unlock()
	pass("no live run for longer: the completer's own keys judge", nil, 4)

	// Slowed at one key at once, the runs are slowed by more than the
	// completer: their p99 then draws the line.
	for _, want := range []int{3, 2, 1, 1, 1} {
		pass("runs slowed from elsewhere", runs(100, 30*time.Millisecond, 0, 0), want)
	}
	pass("as slow as at one key at once", runs(100, 30*time.Millisecond, 0, 0), 2)
	pass("slower than that by half", runs(100, 30*time.Millisecond, 2, 46*time.Millisecond), 1)

	// A drain that begins after too few idle runs draws no line: it
	// judges nothing of them.
	live.drain(false)
	fresh := NewCompleter(cfg, nil, nil, nil, nil, 90*time.Second, nil)
	for _, d := range runs(liveLeast-1, 2*time.Millisecond, 0, 0) {
		fresh.Live.Record(time.Now(), d)
	}
	fresh.Live.drain(true)
	for _, d := range runs(200, time.Second, 200, time.Second) {
		fresh.Live.Record(time.Now(), d)
	}
	if v := fresh.Live.judge(false); v != liveNone {
		t.Errorf("a drain after %d idle runs judged its live runs (%d); want no line drawn", liveLeast-1, v)
	}
}

// A live run that overlapped a pass of the completer is not idle, even
// when the pass found nothing due: the pass's walk of the key table, which
// catches up with a whole backlog after an outage, slows the runs around
// it, and the line drawn from them would let the drain slow live runs as
// much.
func TestLiveDrawsTheLineFromRunsOutsideThePasses(t *testing.T) {
	t.Parallel()
	var l Live
	for range liveIdleRuns {
		l.Record(time.Now(), 2*time.Millisecond)
	}
	end := l.busy()
	for range 50 {
		l.Record(time.Now(), 200*time.Millisecond)
	}
	began := time.Now()
	end()
	l.Record(began, 200*time.Millisecond)
	l.Record(time.Now(), 2*time.Millisecond)
	l.drain(true)
	if want := 3 * time.Millisecond; l.line != want {
		t.Fatalf("the line is %v after slow runs during a pass; want %v, 1.5 times the p99 of the runs outside it", l.line, want)
	}
}
