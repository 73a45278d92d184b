package maintenance

import (
	"slices"
	"sync"
	"time"
)

// Live measures the runs of live requests in the completer's process, so
// that the completer yields to them: while it drains a backlog, at most
// liveSlowShare of them may take longer than busyFactor times the p99 of
// those that ran while it was idle, their calls left out. That is the
// promise itself (their p99 within busyFactor of its value before the
// drain), counted as the share of runs past the line, which a hundred runs
// tell, where their p99 would take thousands. A slow provider does not
// count; the queue for the server's CPU, its locks and the pool, which the
// completer's keys lengthen, does.
//
// A run that overlapped a pass of the completer is not idle, even a pass
// that found nothing due: the pass's walk of the key table, which catches
// up with a whole backlog at the first pass after an outage, slows live
// runs for as long as it reads.
//
// Live runs may be slowed by more than the completer: a surge of
// requests, another tenant of the machine. When they are slowed while it
// runs one key at a time, it can yield no further, and the line is drawn
// anew from those runs: from then on the completer answers for what it
// adds to them.
//
// It is safe for concurrent use. The zero Live is ready; a phase.Client
// records each live run into its completer's.
type Live struct {
	mu sync.Mutex
	// draining is set while a pass of the completer holds keys.
	draining bool
	// passes counts the completer's passes and keys under way, and quiet
	// is when the last of them ended.
	passes int
	quiet  time.Time
	// idle holds the last len(idle) live runs' times that ended while the
	// completer was idle; n counts every one recorded.
	idle [liveIdleRuns]time.Duration
	n    int
	// line is busyFactor times the p99 of idle, taken when the drain
	// began, or of runs judged slowed at one key at a time; zero when too
	// few runs were seen to tell.
	line time.Duration
	// judged holds the times of the live runs that ended during the drain
	// and have not been judged yet, and last when the last of them ended.
	judged []time.Duration
	last   time.Time
	// floored counts the verdicts in a row that found runs slowed while
	// the completer ran one key at a time.
	floored int
}

const (
	// liveIdleRuns is how many runs of an idle completer's process the
	// line is taken from, and liveLeast the fewest that can give it.
	liveIdleRuns = 1000
	liveLeast    = 200
	// liveJudged is how many runs during a drain a pass judges at once:
	// fewer are carried over to the next pass.
	liveJudged = 100
	liveKept   = 10_000
	// liveSlowShare is the share of runs past the line above which the
	// completer yields: a p99 within the line allows one in a hundred.
	liveSlowShare = 0.01
	// liveQuiet is how long after the last live run the completer stops
	// waiting for more to judge, and judges by its own keys alone.
	liveQuiet = 2 * time.Second
)

// Record takes the time one live run that began at began took, its calls
// left out.
func (l *Live) Record(began time.Time, own time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.draining {
		if l.passes > 0 || began.Before(l.quiet) {
			return
		}
		l.idle[l.n%liveIdleRuns] = own
		l.n++
		return
	}
	// A pass judges the runs at its end; a long one judges the first
	// liveKept of them.
	if l.line == 0 || len(l.judged) >= liveKept {
		return
	}
	l.judged = append(l.judged, own)
	l.last = time.Now()
}

// busy marks a pass or a key of the completer under way until the
// function it returns is called.
func (l *Live) busy() (end func()) {
	l.mu.Lock()
	l.passes++
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.passes--
		l.quiet = time.Now()
	}
}

// drain marks whether the completer holds keys. When a drain begins, the
// line is drawn from the runs seen while it was idle.
func (l *Live) drain(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if on == l.draining {
		return
	}
	l.draining = on
	l.judged, l.last = l.judged[:0], time.Time{}
	if !on {
		return
	}
	l.line = 0
	if n := min(l.n, liveIdleRuns); n >= liveLeast {
		l.line = lineOf(slices.Clone(l.idle[:n]))
	}
}

// lineOf is busyFactor times the p99 of runs, which it sorts.
func lineOf(runs []time.Duration) time.Duration {
	slices.Sort(runs)
	return time.Duration(busyFactor * float64(runs[len(runs)*99/100]))
}

// verdict is what the live runs seen during a drain tell the pace.
type verdict int

const (
	// liveNone: no live run was seen lately, or no line drawn.
	liveNone verdict = iota
	// livePending: too few runs to tell yet, the last of them lately;
	// they are counted on.
	livePending
	// liveClear: at most liveSlowShare of them took longer than the line.
	liveClear
	// liveSlowed: more than liveSlowShare of them did.
	liveSlowed
)

// judge tells whether the live runs seen during the drain since it last
// judged them were slowed, and then counts anew; with fewer than
// liveJudged it tells livePending, or liveNone when none ended within
// liveQuiet, and counts on. Slowed at one key at a time (floor) twice in
// a row, they draw the line anew.
func (l *Live) judge(floor bool) verdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.judged) < liveJudged {
		if l.last.IsZero() || time.Since(l.last) > liveQuiet {
			return liveNone
		}
		return livePending
	}
	slow := 0
	for _, d := range l.judged {
		if d > l.line {
			slow++
		}
	}
	v := liveClear
	if float64(slow) > liveSlowShare*float64(len(l.judged)) {
		v = liveSlowed
	}
	// The first runs judged at one key at a time include runs slowed
	// before; the second verdict in a row judges runs of its own only.
	switch {
	case v == liveSlowed && floor:
		if l.floored++; l.floored >= 2 {
			l.line, l.floored = lineOf(l.judged), 0
		}
	default:
		l.floored = 0
	}
	l.judged = l.judged[:0]
	return v
}
