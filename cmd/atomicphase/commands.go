package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// commands in the order the usage lists them.
var commands = []command{
	{
		name: "inspect", args: "TENANT KEY", nargs: 2,
		summary: "show everything stored for one key",
		detail: `
Show everything stored for the tenant's key: its status, where its workflow
got to, who holds it, its attempts, the completer's failures on it, its last
error, its request, state and stored response, and the token to pass as
-seen to unlock, hold, retry or resolve, so that they act only on the key as shown.
The response body is shown shortened; -json prints every field, the body
base64-encoded, lease_left_ns (the lease time left by the database clock)
in nanoseconds and the token as seen.

Exits with status 3 if the tenant has no such key.`,
		define: defineInspect,
	},
	{
		name: "list", args: "", nargs: 0,
		summary: "list keys by state, workflow, tenant, key prefix or age",
		detail: `
List the keys the flags select, a page at a time. With -state (or its
shorthands -stuck, -unknown and -dead), only the keys in that state:

  stuck      unfinished keys, not on hold, with no live lease and idle for longer
             than -stuck-after: the completer's backlog. A few are normal; a
             growing list means no completer runs, or it keeps failing.
  unknown    keys whose last foreign call may or may not have happened,
             waiting for reconciliation; see 'atomicphase resolve -h'.
  dead       keys the completer gave up on after MaxAttempts failed runs
             of its own, or an operator put on hold ('atomicphase hold');
             see 'atomicphase retry -h'.
  in_flight, waiting, finished: see 'atomicphase counts -h'.

Keys of the unfinished states are listed idle longest first; finished keys,
and all keys when no state is given, newest first. A full page ends with the
cursor to pass as -after for the next one; each page costs about the same
however deep into the listing it starts.`,
		define: defineList,
	},
	{
		name: "unlock", args: "TENANT KEY", nargs: 2,
		summary: "free a key's lease so that it resumes now",
		detail: `
Free the lease on the tenant's key, whoever holds it, keeping its recovery
point: the next request for the key, or the completer, resumes it at once
instead of waiting for the lease to expire.

Warning: a holder that is still alive is fenced out. Its next write fails
with a lost lease, the phase it was running is rolled back and redone by
the next run, and a foreign call it was making may be made again. Unlock a
key only when its holder is known to be gone (its process crashed or hangs),
not when it is merely slow.

A key on hold stays on hold; see 'atomicphase retry -h'.

-seen takes the token 'atomicphase inspect' printed: the lease is freed only
if it is still the one inspect showed, so a lease a new run took since is
left alone. Without -seen, the lease freed is the one read just before.
Exits with status 3 if the tenant has no such key, 4 if the key changed
since it was seen (nothing is freed; the refusal is audited), and 0 with a
note if the key had no lease.`,
		define: defineUnlock,
	},
	{
		name: "hold", args: "TENANT KEY", nargs: 2,
		summary: "stop an unfinished key: dead until retried",
		detail: `
Put the tenant's unfinished key on hold as dead, keeping its recovery
point, state and pending call: neither the completer nor a request runs it
again (a request is answered 409, on hold) until 'atomicphase retry' takes
it off hold. Use it for a key whose runs crash the process that runs them,
which the completer cannot count as failures and runs again each time the
lease runs out, or for one that must wait for a fix.

A lease on the key is cleared. A holder still alive is fenced out, as with
'atomicphase unlock': its next write fails, the phase it was running is
rolled back, and a foreign call it was making goes on; a repeatable call
it was about to make may still go out once, under the same downstream key.
Retried, the key resumes at its recovery point; the call of a phase it was
cut short in is made again with the same downstream key, or reconciled
when it is not safe to repeat.

-seen takes the token 'atomicphase inspect' printed: the key is held only
if it is still as inspect showed it. Without -seen, it is held only if it
is still as read just before, so the lease cleared is the one the message
names.
Exits with status 3 if the tenant has no such key, 4 if the key changed
since it was seen (nothing changes; the refusal is audited), and 1 if the
key is finished or already on hold.`,
		define: defineHold,
	},
	{
		name: "retry", args: "TENANT KEY", nargs: 2,
		summary: "take a dead or unknown key off hold, to run again",
		detail: `
Take a key off hold, to run again, keeping its recovery point, state and
last error, and give the completer its full MaxAttempts on it again. The
next request for the key resumes it at once; the completer takes it once it
has been idle for the completer's StuckAfter (a minute by default).

A dead key (the completer gave up on it) can always be retried. Fix what
made it fail first, or it will end up dead again.

A key held as unknown waits for reconciliation because its last foreign
call may or may not have happened. Retrying it repeats that call instead
of reconciling it, so it needs -confirm-unknown: pass it only once you have
checked with the provider that the call did not happen, or know that
making it twice is harmless.

-seen takes the token 'atomicphase inspect' printed: the key is retried
only if it is still as inspect showed it, and a resolution pending on it is
dropped only if inspect showed that resolution. Without -seen, a key with a
pending resolution is not retried.

Exits with status 3 if the tenant has no such key, 4 if the key changed
since it was seen or has a resolution pending (nothing changes; the refusal
is audited), and 1 if the key is not on hold.`,
		define: defineRetry,
	},
	{
		name: "resolve", required: "-at POINT -happened|-not-happened", args: "TENANT KEY", nargs: 2,
		summary: "say what became of a key's unknown foreign call",
		detail: `
Resolve the unknown outcome of the tenant's key: the foreign call of the
phase after recovery point -at either happened, and -output is what it
returned (the JSON the phase's record function takes, such as
'{"id":"ch_123"}'), or it did not happen and is to be made again with the
same downstream key. Check with the provider first, by the downstream key.

-at is the recovery point 'atomicphase inspect' showed: if the key has
moved on since, nothing is recorded and the command exits with status 1.
A resolution is recorded only while none is pending on the key: to replace
a pending one, pass -seen with the token inspect printed while showing it.
With -seen, the resolution is recorded only if the key is still as inspect
showed it. Otherwise nothing is recorded and the command exits with status
4; the refusal is audited. Of two resolutions sent at once, one is
recorded.

The resolution is recorded on the key. This command does not know the
application's workflows, so the application's completer acts on it at its
next pass over the key (within its StuckAfter), and decodes -output into the
phase's output type then; if it does not fit, the key stays held as unknown
with that error. The console mounted in the application checks -output at
once and runs the key at once. Every resolution is audited.`,
		define: defineResolve,
	},
	{
		name: "bulk", required: "-retry|-unlock", args: "", nargs: 0,
		summary: "retry or unlock every key a filter selects",
		detail: `
Retry (-retry) or free the lease of (-unlock) every key the filter flags
select, as 'atomicphase retry' and 'atomicphase unlock' do one key, up to
-limit keys. Without -yes it only counts the keys it would change. Retrying
takes dead keys only, and keys held as unknown too with -confirm-unknown
(their last foreign call is made again). Keys a run holds locked at that
moment are skipped. Every key changed is audited with the filter.`,
		define: defineBulk,
	},
	{
		name: "audit", args: "", nargs: 0,
		summary: "show the operator actions recorded",
		detail: `
Show the operator actions recorded (unlock, hold, retry, resolve, from this
command, the console or the application), newest first: when, who, what,
which key, and the key's recovery point and hold before and after. -json
prints every field, with the key's fields before and after in full.`,
		define: defineAudit,
	},
	{
		name: "console", args: "", nargs: 0,
		summary: "serve the web console on localhost",
		detail: `
Serve the web console for the database: an overview of the keys by
workflow and state, the key list with filters and paging, each key's
request, state, phases, lease and audit, and the actions unlock, retry,
resolve and bulk retry or unlock, each confirmed and audited under -actor.

The console listens on 127.0.0.1:8080 (-listen) and asks for a token: the
one in $ATOMICPHASE_CONSOLE_TOKEN, or else one it makes up and prints.
-no-auth lets anyone who reaches the address in; -read-only removes every
action. This command does not know the application's workflows: a key's
phases are not listed, and a resolution is recorded for the application's
completer to act on. Mount console.New in the application, behind its own
authentication, for those.`,
		define: defineConsole,
	},
	{
		name: "reap", args: "", nargs: 0,
		summary: "close abandoned keys and delete expired ones",
		detail: `
Run the reaper once, as the application's phase.Client does. It first
gives abandoned keys (dead, or off hold and idle for the whole retention,
with no live lease) a terminal 500 "request abandoned" response, then
deletes, batch after batch, the finished keys whose response is older than
the retention. Keys it closes are deleted a retention later. Keys in flight
or held as unknown are never touched.

It judges the keys of every workflow, and never deletes or closes a key
before the retention the key recorded when it was created (its workflow's
phase.StoreConfig.Retention). Keys stored before retentions were recorded
have none: for them, use the application reaper's retention, since with a
shorter one a client that retries a deleted key runs its request again.

With -dry-run, reap counts what a run would do and changes nothing. It
counts rows that a request happens to hold locked at that moment, which a
run would skip until its next pass.`,
		define: defineReap,
	},
	{
		name: "counts", args: "", nargs: 0,
		summary: "count keys by state",
		detail: `
Count the keys by state. Every key is in exactly one, so the counts add up
to the total:

  finished   the response is stored
  in flight  unfinished and held by a live lease
  waiting    unfinished, not on hold, with no live lease and idle for at most
             -stuck-after: a client is expected to retry it, or the
             completer to take it once it has been idle long enough
  stuck      like waiting, but idle for longer than -stuck-after: the
             completer's backlog
  unknown    awaiting reconciliation of a foreign call
  dead       given up on by the completer, or put on hold by an operator

'atomicphase list' shows the keys behind the last three.

The backlog line counts the keys stuck or waiting and says how fast the
completer's keys (unfinished, not on hold: in flight, waiting or stuck)
fell since the newest count of them a completer took at least 10 seconds
ago (the completers' pace less the keys left unfinished meanwhile), over
the span it names, and when, at that rate, none will be left. Keys
passing from waiting to stuck are neither a drain nor growth. Each
process's completer counts them every five seconds, so the rate is the
average of about the last 10 to 15 seconds; it is unknown in the first
10 seconds after a completer starts, where none counted between 10 and 30
seconds ago, and on a schema without migration 015 (it says so). When no
completer has counted for over 10 seconds it says so, and gives no time.
It also says how many keys the completer does not take yet (idle for less
than -stuck-after, or waiting out the default backoff of its failures on
them) and when they come due; when none is due it says "none due yet".`,
		define: defineStats,
	},
	{
		name: "migrate", args: "", nargs: 0,
		summary: "apply schema migrations, or print their SQL",
		detail: `
Apply the schema migrations that the database lacks, each in its own
transaction with the row that records its version, and say which versions
the database went through. The first run creates the idempotency_keys
table and atomicphase_migration, where the versions are recorded; a
database set up with schema.sql or by a release before versioned
migrations is adopted unchanged. Safe to run more than once, and from
several processes at once. A database that a newer release migrated is
refused, with exit status 1.

With -status, migrate prints the database's version, the latest version
this release knows and the migrations pending, and changes nothing.

With -print, migrate writes the SQL of the migrations to stdout instead of
applying it, and needs no database: for teams that manage their schema with
their own tool (goose, atlas, sqitch). It prints every migration, or with
-from N those after version N; each is idempotent. -json prints each one's
version, name and SQL. There are no down migrations. The printed SQL does
not record its versions in atomicphase_migration (your tool records what it
applied), so -status reads such a database as version 0 with every
migration pending; migrate adopts it unchanged.

With -schema, migrate applies or prints the migrations with every table and
function named in that schema, whatever the search_path; applying them
creates the schema when it is missing, and so does the first migration
printed.`,
		define: defineMigrate,
	},
}

// notFoundError names the missing key; it matches keyrow.ErrNotFound, which
// selects exit status 3.
type notFoundError struct{ tenant, key string }

func (e *notFoundError) Error() string {
	return fmt.Sprintf("tenant %q has no key %q", e.tenant, e.key)
}

func (e *notFoundError) Unwrap() error { return keyrow.ErrNotFound }

func inspect(ctx context.Context, c *phase.Client, tenant, key string) (*keyrow.Row, error) {
	info, err := c.Inspect(ctx, tenant, key)
	if errors.Is(err, keyrow.ErrNotFound) {
		return nil, &notFoundError{tenant: tenant, key: key}
	}
	return info, err
}

func defineInspect(*flag.FlagSet) action {
	return func(ctx context.Context, s *session, args []string) error {
		c, err := s.client(ctx, phase.Config{})
		if err != nil {
			return err
		}
		info, err := inspect(ctx, c, args[0], args[1])
		if err != nil {
			return err
		}
		if s.json {
			return s.writeJSON(struct {
				*keyrow.Row
				Seen string `json:"seen"`
			}{info, info.Seen().String()})
		}
		return printKey(s.stdout, info, time.Now())
	}
}

func defineList(fs *flag.FlagSet) action {
	f := defineFilter(fs)
	fs.StringVar(&f.After, "after", "", "start after this `cursor`, printed at the end of the previous page")
	fs.IntVar(&f.Limit, "limit", keyrow.DefaultListLimit, "the most keys to list")
	return func(ctx context.Context, s *session, _ []string) error {
		if err := f.check(fs); err != nil {
			return err
		}
		if f.Limit <= 0 {
			return usagef("-limit must be positive")
		}
		c, err := s.client(ctx, phase.Config{Completer: recovery.CompleterConfig{StuckAfter: minIdle(f.StuckAfter)}})
		if err != nil {
			return err
		}
		page, err := c.List(ctx, f.ListFilter)
		if err != nil {
			return err
		}
		if s.json {
			return s.writeJSON(page)
		}
		return printList(s.stdout, page, f.ListFilter, time.Now())
	}
}

// readKey reads the tenant's key before an action that clears its lease,
// for the exit status of a missing key and to say what lease it was, and
// returns what the action is to expect of the key: what -seen gave, or
// else the key as read here, so that the lease the action clears is the
// one its message names.
func readKey(ctx context.Context, s *session, tenant, key string, seen *seenFlag) (*phase.Client, *keyrow.Row, []keyrow.Seen, error) {
	c, err := s.client(ctx, phase.Config{})
	if err != nil {
		return nil, nil, nil, err
	}
	info, err := inspect(ctx, c, tenant, key)
	if err != nil {
		return nil, nil, nil, err
	}
	expect := seen.list()
	if expect == nil {
		expect = []keyrow.Seen{info.Seen()}
	}
	return c, info, expect, nil
}

func defineUnlock(fs *flag.FlagSet) action {
	seen := defineSeen(fs)
	return func(ctx context.Context, s *session, args []string) error {
		tenant, key := args[0], args[1]
		c, info, expect, err := readKey(ctx, s, tenant, key, seen)
		if err != nil {
			return err
		}
		freed, err := c.Unlock(s.acting(ctx), tenant, key, expect...)
		if err != nil {
			return refused(err, tenant, key)
		}
		if s.json {
			return s.writeJSON(struct {
				Tenant   string `json:"tenant"`
				Key      string `json:"key"`
				Unlocked bool   `json:"unlocked"`
			}{tenant, key, freed})
		}
		return printUnlock(s.stdout, info, freed)
	}
}

func defineHold(fs *flag.FlagSet) action {
	seen := defineSeen(fs)
	return func(ctx context.Context, s *session, args []string) error {
		tenant, key := args[0], args[1]
		c, info, expect, err := readKey(ctx, s, tenant, key, seen)
		if err != nil {
			return err
		}
		// A key the read found finished or held goes to the store all
		// the same, which refuses it and audits the refusal.
		what := "finished or went on hold while being held; inspect it"
		if info.Hold != "" || info.FinishedAt != nil {
			what = fmt.Sprintf("is %s; only an unfinished key off hold can be held", status(info))
		}
		err = acted(c.Hold(s.acting(ctx), tenant, key, expect...), tenant, key, keyrow.ErrNotRunnable, what)
		if err != nil {
			return err
		}
		if s.json {
			return s.writeJSON(struct {
				Tenant        string `json:"tenant"`
				Key           string `json:"key"`
				RecoveryPoint string `json:"recovery_point"`
				LeaseCleared  bool   `json:"lease_cleared"`
			}{tenant, key, info.RecoveryPoint, info.LeaseTakenAt != nil})
		}
		return printHold(s.stdout, info)
	}
}

func defineRetry(fs *flag.FlagSet) action {
	confirmUnknown := fs.Bool("confirm-unknown", false,
		"retry a key held as unknown, repeating its last foreign call")
	seen := defineSeen(fs)
	return func(ctx context.Context, s *session, args []string) error {
		tenant, key := args[0], args[1]
		c, err := s.client(ctx, phase.Config{})
		if err != nil {
			return err
		}
		info, err := inspect(ctx, c, tenant, key)
		if err != nil {
			return err
		}
		// A key the read found off hold goes to the store all the same,
		// which refuses it and audits the refusal.
		what, expect := "left its hold while being retried; inspect it", seen.list()
		switch info.Hold {
		case "":
			what = fmt.Sprintf("is %s, not on hold; nothing to retry", status(info))
			if expect == nil {
				// Held since the read, it is not the key the operator saw.
				expect = []keyrow.Seen{info.Seen()}
			}
		case keyrow.HoldUnknown:
			if !*confirmUnknown {
				return usagef("key %q of tenant %q is held as unknown: its last foreign call may have happened "+
					"and retrying makes it again; check with the provider, then pass -confirm-unknown", key, tenant)
			}
		}
		err = acted(c.Retry(s.acting(ctx), tenant, key, expect...), tenant, key, keyrow.ErrNotHeld, what)
		if err != nil {
			return err
		}
		if s.json {
			return s.writeJSON(struct {
				Tenant        string      `json:"tenant"`
				Key           string      `json:"key"`
				PreviousHold  keyrow.Hold `json:"previous_hold"`
				RecoveryPoint string      `json:"recovery_point"`
			}{tenant, key, info.Hold, info.RecoveryPoint})
		}
		_, err = fmt.Fprintf(s.stdout, "key %s of tenant %s was %s and is off hold, waiting at recovery point %s:\n"+
			"the next request resumes it now, the completer once it has been idle for its stuck-after\n",
			clean(key), clean(tenant), info.Hold, clean(info.RecoveryPoint))
		return err
	}
}

// reapReport is what reap prints; a dry run reports what a run would do.
type reapReport struct {
	DryRun    bool   `json:"dry_run"`
	Retention string `json:"retention"`
	// Abandoned keys, unfinished past the retention, got their terminal
	// response.
	Abandoned int `json:"abandoned"`
	// Reaped finished keys were past the retention, and are deleted.
	Reaped int `json:"reaped"`
}

func defineReap(fs *flag.FlagSet) action {
	dryRun := fs.Bool("dry-run", false, "count what a run would do and change nothing")
	retention := fs.Duration("retention", recovery.DefaultRetention, "how long finished keys are kept and replayed")
	batch := fs.Int("batch", recovery.DefaultReapBatch, "the most keys one statement changes")
	return func(ctx context.Context, s *session, _ []string) error {
		if *retention <= 0 || *batch <= 0 {
			return usagef("-retention and -batch must be positive")
		}
		c, err := s.client(ctx, phase.Config{Reaper: recovery.ReaperConfig{Retention: *retention, BatchSize: *batch}})
		if err != nil {
			return err
		}
		report := reapReport{DryRun: *dryRun, Retention: retention.String()}
		var runErr error
		if *dryRun {
			report.Reaped, report.Abandoned, runErr = c.ReapCandidates(ctx)
		} else {
			var res recovery.ReapResult
			res, runErr = c.Reap(ctx)
			report.Abandoned, report.Reaped = res.Abandoned, res.Reaped
		}
		// A run that fails part-way has still changed keys: report them.
		if s.json {
			err = s.writeJSON(report)
		} else {
			err = printReap(s.stdout, report)
		}
		return errors.Join(runErr, err)
	}
}

// countsReport is what counts prints under -json: the count of every state
// and their total.
type countsReport struct {
	keyrow.Counts
	Total int `json:"total"`
	// Definitions counts the unfinished keys of each workflow definition.
	Definitions []keyrow.DefinitionCount `json:"definitions"`
	// Backlog is the stuck and waiting keys and how fast they drain.
	Backlog phase.Backlog `json:"backlog"`
}

func defineStats(fs *flag.FlagSet) action {
	stuckAfter := fs.Duration("stuck-after", recovery.DefaultStuckAfter, "how long a key must be idle to be stuck")
	return func(ctx context.Context, s *session, _ []string) error {
		if *stuckAfter < 0 {
			return usagef("-stuck-after must not be negative")
		}
		c, err := s.client(ctx, phase.Config{Completer: recovery.CompleterConfig{StuckAfter: minIdle(*stuckAfter)}})
		if err != nil {
			return err
		}
		counts, err := c.Counts(ctx)
		if err != nil {
			return err
		}
		defs, err := c.Definitions(ctx)
		if err != nil {
			return err
		}
		backlog, err := c.BacklogOf(ctx, counts)
		if err != nil {
			return err
		}
		if s.json {
			return s.writeJSON(countsReport{Counts: counts, Total: counts.Total(), Definitions: defs, Backlog: backlog})
		}
		return printStats(s.stdout, counts, defs, backlog, *stuckAfter, time.Now())
	}
}

// migrationJSON is a migration as migrate -json prints it; SQL only with
// -print.
type migrationJSON struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	SQL     string `json:"sql,omitempty"`
}

func toJSON(ms []atomicphase.Migration, withSQL bool) []migrationJSON {
	out := make([]migrationJSON, 0, len(ms))
	for _, m := range ms {
		j := migrationJSON{Version: m.Version, Name: m.Name}
		if withSQL {
			j.SQL = m.SQL
		}
		out = append(out, j)
	}
	return out
}

// migrateReport is what migrate prints after applying migrations.
type migrateReport struct {
	PreviousVersion int `json:"previous_version"`
	Version         int `json:"version"`
	// Applied are the migrations between the two versions. A migrate
	// running at the same time elsewhere may have applied some of them.
	Applied []migrationJSON `json:"applied"`
}

// migrateStatus is what migrate -status prints.
type migrateStatus struct {
	Version int             `json:"version"`
	Latest  int             `json:"latest"`
	Pending []migrationJSON `json:"pending"`
}

func defineMigrate(fs *flag.FlagSet) action {
	status := fs.Bool("status", false, "print the database's version and the pending migrations; change nothing")
	printSQL := fs.Bool("print", false, "print the migrations' SQL instead of applying it; needs no database")
	from := fs.Int("from", 0, "with -print: print only the migrations after this `version`")
	return func(ctx context.Context, s *session, _ []string) error {
		switch {
		case *status && *printSQL:
			return usagef("pass at most one of -status and -print")
		case isSet(fs, "from") && !*printSQL:
			return usagef("-from applies only to -print")
		case *from < 0:
			return usagef("-from must not be negative")
		}
		m := atomicphase.Migrator{Schema: s.schema}
		all, err := m.Migrations()
		if err != nil {
			return err
		}
		if *printSQL {
			if *from > len(all) {
				return fmt.Errorf("version %d is newer than this release knows (up to %d)", *from, len(all))
			}
			if s.json {
				return s.writeJSON(toJSON(all[*from:], true))
			}
			return printMigrations(s.stdout, all[*from:])
		}
		db, err := s.db(ctx)
		if err != nil {
			return err
		}
		before, err := m.Version(ctx, db)
		if err != nil {
			return err
		}
		if *status {
			st := migrateStatus{Version: before, Latest: len(all), Pending: toJSON(all[min(before, len(all)):], false)}
			if s.json {
				return s.writeJSON(st)
			}
			return printMigrateStatus(s.stdout, st)
		}
		if err := m.Migrate(ctx, db); err != nil {
			return err
		}
		after, err := m.Version(ctx, db)
		if err != nil {
			return err
		}
		report := migrateReport{PreviousVersion: before, Version: after, Applied: toJSON(all[before:after], false)}
		if s.json {
			return s.writeJSON(report)
		}
		return printMigrate(s.stdout, report)
	}
}

// minIdle is the completer's StuckAfter that makes a key stuck once idle for
// longer than d. The config reads zero as its default, so no wait is -1.
func minIdle(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// isSet reports whether the command line set the flag, as opposed to
// leaving its default.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
