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
