package recovery

import (
	"cmp"
	"fmt"
	"time"
)

// Defaults for CompleterConfig's zero values.
const (
	// DefaultInterval is how often the completer looks for due keys.
	DefaultInterval = 5 * time.Second
	// DefaultBatchSize is how many keys one pass claims.
	DefaultBatchSize = 100
	// DefaultStuckAfter is how long a key's last run must be past before the
	// completer takes it, leaving a client time to retry on its own. The
	// reference implementation waits 60 seconds.
	DefaultStuckAfter = time.Minute
	// DefaultBackoff is the pause added after the completer's first failure
	// on a key, doubling with each further one up to DefaultMaxBackoff.
	DefaultBackoff    = 30 * time.Second
	DefaultMaxBackoff = time.Hour
	// DefaultMaxAttempts is how many failures of the completer's own an
	// abandoned key gets before it is dead.
	DefaultMaxAttempts = 10
	// DefaultConcurrency is how many claimed keys run at once.
	DefaultConcurrency = 4
)

// CompleterConfig configures the completer of a phase.Client. Zero values
// mean the default.
type CompleterConfig struct {
	// Interval is the pause after a pass that found no due keys, or only
	// keys it had handed back already. A pass that claimed keys is
	// followed at once by the next, so a backlog drains as fast as its
	// keys finish (see # Pace in the package documentation). After a pass that failed (the
	// store) or whose keys mostly failed (their providers) the pause
	// doubles, up to a minute or Interval, whichever is longer. Through
	// any pause the completer counts its keys every five seconds, for the
	// backlog's drain rate (phase.Client.Backlog). -1 disables the
	// completer in Start, for a process that only serves. The client's
	// Complete still runs passes on demand. Defaults to DefaultInterval.
	Interval time.Duration
	// BatchSize caps the keys claimed per pass. A pass claims fewer when
	// the keys finish too slowly for the last of them to start within half
	// their lease; the first pass, and a pass after one whose keys mostly
	// failed, claim only as many as they run at once. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// Concurrency caps the claimed keys run at once. After a pass whose keys
	// mostly failed the completer runs half as many at once, after one
	// that slowed the process's live requests a quarter fewer (see # Pace
	// in the package documentation), and one more after each pass that
	// went well, back up to Concurrency. Each key
	// running holds one of the pool's connections while it is in the
	// store: keep Concurrency well below the pool's MaxConns, or live
	// requests wait for connections behind the completer. Defaults to
	// DefaultConcurrency.
	Concurrency int
	// InFlight caps, by workflow name, how many of that workflow's keys
	// the completer runs at once, and so how many calls it has in flight
	// to that workflow's provider (a run makes one call at a time): set it
	// for a provider that rate-limits. The cap holds per process: N
	// processes running completers have up to N times it in flight.
	// Requests that clients send are not counted. A workflow not in the
	// map, or mapped to 0 or -1, is capped by Concurrency alone. The
	// client's NewClient refuses a name it has no workflow of.
	InFlight map[string]int
	// StuckAfter is how long a key must be idle before the completer takes
	// it, and before it can be given up on. -1 means no wait. Give every
	// process the same: on one Postgres a claim that reads a key not yet
	// stuck sets, by its own StuckAfter, when any completer next looks at
	// it, so a process with a shorter one takes such a key no sooner.
	// Defaults to DefaultStuckAfter.
	StuckAfter time.Duration
	// Backoff is added after the completer's first failure on a key. It
	// doubles with each further one, up to MaxBackoff. -1 disables the
	// backoff. Defaults to DefaultBackoff and DefaultMaxBackoff.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// MaxAttempts is how many times the completer fails an abandoned key
	// before moving it to the dead hold. Defaults to DefaultMaxAttempts.
	MaxAttempts int
}

// WithDefaults returns c with every zero field set to its default, or an
// error naming a field whose value is invalid.
func (c CompleterConfig) WithDefaults() (CompleterConfig, error) {
	if err := checkFields("CompleterConfig",
		field{"Interval", c.Interval, -1}, field{"BatchSize", c.BatchSize, 0}, field{"Concurrency", c.Concurrency, 0},
		field{"StuckAfter", c.StuckAfter, -1}, field{"Backoff", c.Backoff, -1}, field{"MaxBackoff", c.MaxBackoff, 0},
		field{"MaxAttempts", c.MaxAttempts, 0}); err != nil {
		return c, err
	}
	for name, n := range c.InFlight {
		if n < -1 {
			return c, fmt.Errorf("recovery: CompleterConfig.InFlight[%q] must not be negative (except -1)", name)
		}
	}
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.StuckAfter = max(cmp.Or(c.StuckAfter, DefaultStuckAfter), 0)
	c.Backoff = max(cmp.Or(c.Backoff, DefaultBackoff), 0)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	return c, nil
}

// Defaults for ReaperConfig's zero values.
const (
	// DefaultRetention is how long a finished key is kept and replayed.
	// Stripe keeps keys at least 24 hours.
	DefaultRetention = 24 * time.Hour
	// DefaultReapBatch is how many keys one delete removes. Small batches
	// keep each transaction and its locks short while traffic runs.
	DefaultReapBatch = 1000
	// DefaultReapInterval is how often the reaper runs.
	DefaultReapInterval = time.Minute
	// DefaultReapPause is the pause between two batches of one run, which
	// leaves the database to traffic between deletes.
	DefaultReapPause = 20 * time.Millisecond
)

// ReaperConfig configures the reaper of a phase.Client. Zero values mean
// the default.
type ReaperConfig struct {
	// Retention is how long a finished key is kept and replayed, for the
	// workflows that set none of their own (phase.StoreConfig.Retention).
	// The reaper judges only the keys of the client's workflows. It never
	// deletes a key before the retention recorded on it when it was
	// created. Defaults to DefaultRetention.
	Retention time.Duration
	// BatchSize is how many keys one delete removes. Defaults to
	// DefaultReapBatch.
	BatchSize int
	// Interval between runs. -1 disables the reaper in Start. The client's
	// Reap still runs it on demand. Defaults to DefaultReapInterval.
	Interval time.Duration
	// Pause between two batches of one run. The pause is this long, or as
	// long as the batch before it took when that was longer. So deleting
	// takes at most half the reaper's time, however slow load makes its
	// batches. -1 means none. Defaults to DefaultReapPause.
	Pause time.Duration
}

// WithDefaults returns c with every zero field set to its default, or an
// error naming a field whose value is invalid.
func (c ReaperConfig) WithDefaults() (ReaperConfig, error) {
	if err := checkFields("ReaperConfig",
		field{"Retention", c.Retention, 0}, field{"BatchSize", c.BatchSize, 0}, field{"Interval", c.Interval, -1},
		field{"Pause", c.Pause, -1}); err != nil {
		return c, err
	}
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultReapBatch)
	c.Interval = cmp.Or(c.Interval, DefaultReapInterval)
	c.Pause = max(cmp.Or(c.Pause, DefaultReapPause), 0)
	return c, nil
}

// PassResult counts what one completer pass did. Completed, Failed and
// HandedBack count the keys that ended during the pass: its own, and any
// that outlasted a pass before it.
type PassResult struct {
	// Claimed keys were taken for a run.
	Claimed int
	// Completed keys ran to their stored response.
	Completed int
	// Failed keys ran and failed again. They keep their recovery point.
	Failed int
	// Dead keys moved to the dead hold: the completer gave up on them.
	Dead int
	// HandedBack keys were claimed and handed back for someone else to act
	// on:
	//
	//   - a process that runs the definition they started under, for keys at
	//     a recovery point the adopting workflow cannot place
	//   - an operator, for a call whose outcome is unknown and that has no
	//     reconcile function
	//   - a later pass, for keys that waited for their workflow's InFlight
	//     cap while the keys holding it outlasted their pass
	HandedBack int
}

// Add returns the sum of r and o.
func (r PassResult) Add(o PassResult) PassResult {
	return PassResult{r.Claimed + o.Claimed, r.Completed + o.Completed, r.Failed + o.Failed, r.Dead + o.Dead, r.HandedBack + o.HandedBack}
}

// ReapResult counts what a reaper run did.
type ReapResult struct {
	// Abandoned keys were left unfinished past retention and got their
	// terminal response.
	Abandoned int
	// Reaped keys were finished and past retention, and are deleted.
	Reaped int
}

// field is a Config field's name, value and least valid value: 0, or -1
// where -1 has a meaning of its own.
type field struct {
	name  string
	value any
	least int64
}

// checkFields returns an error naming the first of config's fields whose
// value is below its least.
func checkFields(config string, fields ...field) error {
	for _, f := range fields {
		var v int64
		switch x := f.value.(type) {
		case int:
			v = int64(x)
		case time.Duration:
			v = int64(x)
		}
		switch {
		case v >= f.least:
		case f.least == 0:
			return fmt.Errorf("recovery: %s.%s is %v; it must not be negative", config, f.name, f.value)
		default:
			return fmt.Errorf("recovery: %s.%s is %v; it must not be negative but for -1, which has a meaning of its own",
				config, f.name, f.value)
		}
	}
	return nil
}
