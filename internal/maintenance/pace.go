package maintenance

import (
	"slices"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase/recovery"
)

// maxPause caps the pause that trouble doubles, unless the completer's
// Interval is longer.
const maxPause = time.Minute

// pace is how hard the completer works: how many keys a pass claims, how
// many it runs at once, and how long it waits before the next pass. It
// follows the keys rather than a clock:
//
//   - A pass that claimed keys is followed at once by the next, so a
//     backlog drains as fast as its keys finish, however its keys are
//     shared with other nodes; a pass that found none, or only keys its
//     streak handed back already, is followed by a pause of Interval.
//   - A pass claims as many keys as finished in half a lease at the last
//     pass's rate (between Concurrency and BatchSize), so that the last
//     key of a batch starts long before its lease, taken at the claim,
//     runs out. The first pass, which knows no rate yet, claims
//     Concurrency.
//   - A pass that failed (store trouble) or whose keys mostly failed
//     (provider trouble) doubles the pause, from Interval up to maxPause;
//     provider trouble also halves the keys run at once, and the next pass
//     claims only as many as it runs at once: a provider still down gets
//     a few calls a pass, not a batch. Each pass that
//     goes well ends the pause and runs one key more at once, up to
//     Concurrency.
//   - Live requests keep priority. After a pass during which more than
//     one in a hundred of this process's live runs took longer than
//     busyFactor times their p99 while the completer was idle (see Live),
//     the next pass runs a quarter fewer keys at once (never none); slowed
//     at one key at once, they are slowed by more than the completer, and
//     their p99 then is the one it keeps them within. It yields as well
//     after a pass whose keys took, in the median, more than busyFactor
//     times the quickest median seen: the store or this process is busy,
//     for live requests of other processes too. Both leave the
//     calls out: what a run takes but its calls grows with the queue for
//     the server's CPU, its locks and the pool that live requests wait in,
//     and not with a slow provider, so a drain bound by its calls' latency
//     is not slowed. While live runs were seen, too few to tell, the pace
//     holds.
//
// It is safe for concurrent use: Drain may run while Start's passes do.
type pace struct {
	mu  sync.Mutex
	cfg recovery.CompleterConfig
	ttl time.Duration
	// claim and running are the next pass's batch and keys at once.
	claim, running int
	// trouble counts the passes in a row that failed or whose keys
	// mostly failed.
	trouble int
	// own is the last pass's median time of a key but its calls, and
	// floor the quickest such median seen, drifting up towards later
	// ones so that it follows a store that got slower for good.
	own, floor time.Duration
	// live, when set, measures this process's live runs.
	live *Live
}

// busyFactor is how much slower than the quickest seen a key's own time
// must be before the completer yields to live requests.
const busyFactor = 1.5

func newPace(cfg recovery.CompleterConfig, ttl time.Duration) *pace {
	return &pace{cfg: cfg, ttl: ttl, claim: min(cfg.Concurrency, cfg.BatchSize), running: cfg.Concurrency}
}

// plan returns how many keys the next pass claims and how many it runs at
// once.
func (p *pace) plan() (claim, running int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.claim, p.running
}

// observe takes the time each key of a pass took but its calls.
func (p *pace) observe(own []time.Duration) {
	if len(own) == 0 {
		return
	}
	slices.Sort(own)
	m := own[len(own)/2]
	p.mu.Lock()
	defer p.mu.Unlock()
	p.own = m
	if p.floor == 0 || m < p.floor {
		p.floor = m
	} else {
		p.floor += (m - p.floor) / 32
	}
}

// liveVerdict is what this process's live runs tell of the last pass
// (see Live).
func (p *pace) liveVerdict() verdict {
	if p.live == nil {
		return liveNone
	}
	return p.live.judge(p.running == 1)
}

// record takes the outcome of a pass that asked for asked keys and took
// took, whether it claimed keys its streak had not handed back (fresh), and
// returns the pause before the next pass.
func (p *pace) record(asked int, res recovery.PassResult, took time.Duration, fresh bool, err error) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A key the completer handed back ran nothing of its own workflow;
	// only the keys that ran tell how the providers and the store are.
	ran := res.Completed + res.Failed
	failing := err == nil && res.Failed > 0 && res.Failed >= res.Completed
	live := p.liveVerdict()
	switch {
	case err != nil:
		p.trouble++
	case failing:
		p.trouble++
		p.running = max(p.running/2, 1)
	case live == liveSlowed || float64(p.own) > busyFactor*float64(p.floor):
		p.trouble = 0
		p.running = max(p.running*3/4, 1)
	case live == livePending:
		// Live runs were seen, too few yet to tell: the pace holds.
		p.trouble = 0
	default:
		p.trouble = 0
		p.running = min(p.running+1, p.cfg.Concurrency)
	}
	// A pass judges only its own keys.
	p.own = 0
	switch {
	case failing:
		p.claim = min(p.running, p.cfg.BatchSize)
	case ran > 0 && took > 0:
		perLease := float64(ran) / took.Seconds() * (p.ttl / 2).Seconds()
		p.claim = int(min(max(perLease, float64(p.cfg.Concurrency)), float64(p.cfg.BatchSize)))
	}
	if p.trouble > 0 {
		return min(p.cfg.Interval<<min(p.trouble-1, 10), max(p.cfg.Interval, maxPause))
	}
	// A pass that claimed keys is followed at once by the next, even when
	// it got fewer than it asked for: other nodes take keys from the same
	// backlog (on Citus, from the same proposed candidates), so a short
	// batch does not mean the backlog is empty. So is one whose keys were
	// all handed back, when they were new to its streak: they now wait
	// behind the other due keys. The pass that finds none, or only keys
	// handed back already, pauses.
	if fresh {
		return 0
	}
	return p.cfg.Interval
}
