package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// acting returns ctx naming the session's actor for the audit.
func (s *session) acting(ctx context.Context) context.Context {
	return phase.WithActor(ctx, s.actor)
}

// filterFlags are the flags that select keys, shared by list and bulk.
type filterFlags struct {
	keyrow.ListFilter
	stuck, unknown, dead bool
	state                string
}

func defineFilter(fs *flag.FlagSet) *filterFlags {
	f := &filterFlags{}
	fs.StringVar(&f.state, "state", "", "only keys in this `state`: finished, in_flight, waiting, stuck, unknown or dead")
	fs.BoolVar(&f.stuck, "stuck", false, "short for -state stuck")
	fs.BoolVar(&f.unknown, "unknown", false, "short for -state unknown")
	fs.BoolVar(&f.dead, "dead", false, "short for -state dead")
	fs.DurationVar(&f.StuckAfter, "stuck-after", recovery.DefaultStuckAfter,
		"how long a key must be idle to be stuck rather than waiting")
	fs.StringVar(&f.Workflow, "workflow", "", "only keys of this `workflow`")
	fs.StringVar(&f.Tenant, "tenant", "", "only keys of this `tenant`")
	fs.StringVar(&f.KeyPrefix, "key-prefix", "", "only keys that start with this `prefix`")
	fs.DurationVar(&f.OlderThan, "older-than", 0, "only keys first seen at least this long ago")
	fs.DurationVar(&f.NewerThan, "newer-than", 0, "only keys first seen at most this long ago")
	return f
}

// check resolves the state shorthands and reports contradictory flags.
func (f *filterFlags) check(fs *flag.FlagSet) error {
	chosen := 0
	for state, on := range map[string]bool{"stuck": f.stuck, "unknown": f.unknown, "dead": f.dead, f.state: f.state != ""} {
		if on {
			f.Status = keyrow.Status(state)
			chosen++
		}
	}
	switch {
	case chosen > 1:
		return usagef("pass at most one of -state, -stuck, -unknown and -dead")
	case isSet(fs, "stuck-after") && f.Status != keyrow.StatusStuck && f.Status != keyrow.StatusWaiting:
		return usagef("-stuck-after applies only to the stuck and waiting states")
	case f.StuckAfter < 0 || f.OlderThan < 0 || f.NewerThan < 0:
		return usagef("-stuck-after, -older-than and -newer-than must not be negative")
	}
	if f.Status != "" && !slices.Contains(keyrow.Statuses(), f.Status) {
		return usagef("unknown state %q; use finished, in_flight, waiting, stuck, unknown or dead", f.Status)
	}
	return nil
}

// seenFlag is the -seen flag of the single-key actions: what the operator
// saw of the key, as inspect printed it.
type seenFlag struct{ seen *keyrow.Seen }

func defineSeen(fs *flag.FlagSet) *seenFlag {
	f := &seenFlag{}
	fs.Func("seen", "act only while the key is as it was when inspect printed this `token`; "+
		"without it, nothing stops the action from undoing a change made since you looked", func(v string) error {
		seen, err := keyrow.ParseSeen(v)
		if err != nil {
			return errors.New("not a token that inspect printed")
		}
		f.seen = &seen
		return nil
	})
	return f
}

// list returns what the action passes on: nothing, or what was seen.
func (f *seenFlag) list() []keyrow.Seen {
	if f.seen == nil {
		return nil
	}
	return []keyrow.Seen{*f.seen}
}

// changedError is an action refused because the key changed since it was
// seen: exit status 4.
type changedError struct {
	tenant, key string
	err         *keyrow.ChangedError
}

func (e *changedError) Error() string {
	return fmt.Sprintf("nothing changed: key %q of tenant %q: %s; inspect it again", e.key, e.tenant, clean(e.err.Reason()))
}

func (e *changedError) Unwrap() error { return e.err }

// refused turns a refusal of an action on the key into a changedError,
// and returns any other error as it is.
func refused(err error, tenant, key string) error {
	var changed *keyrow.ChangedError
	if errors.As(err, &changed) {
		return &changedError{tenant: tenant, key: key, err: changed}
	}
	return err
}

// acted is what a command reports of the error err of its action on a
// key: a refusal as refused says, and the key not in the state the action
// needs (left) as what says: the state its read found, or what the key did
// since.
func acted(err error, tenant, key string, left error, what string) error {
	err = refused(err, tenant, key)
	var changed *changedError
	if !errors.As(err, &changed) && errors.Is(err, left) {
		return fmt.Errorf("key %q of tenant %q %s", key, tenant, what)
	}
	return err
}

// resolveReport is what resolve prints.
type resolveReport struct {
	Tenant     string            `json:"tenant"`
	Key        string            `json:"key"`
	Resolution keyrow.Resolution `json:"resolution"`
}

func defineResolve(fs *flag.FlagSet) action {
	var (
		r           keyrow.Resolution
		notHappened bool
		output      string
		seen        = defineSeen(fs)
	)
	fs.StringVar(&r.RecoveryPoint, "at", "", "the key's recovery point as inspect showed it; nothing is recorded if it moved on")
	fs.BoolVar(&r.Happened, "happened", false, "the call happened; pass what it returned as -output")
	fs.BoolVar(&notHappened, "not-happened", false, "the call did not happen; it is made again with the same downstream key")
	fs.StringVar(&output, "output", "", "with -happened: the call's output as `JSON`, as the phase's record function takes it")
	return func(ctx context.Context, s *session, args []string) error {
		tenant, key := args[0], args[1]
		switch {
		case r.RecoveryPoint == "":
			return usagef("pass -at with the key's recovery point as inspect shows it")
		case r.Happened == notHappened:
			return usagef("pass exactly one of -happened and -not-happened")
		case r.Happened && !json.Valid([]byte(output)):
			return usagef("-happened needs -output with the call's output as JSON")
		case notHappened && output != "":
			return usagef("-output applies only to -happened")
		}
		if r.Happened {
			r.Output = json.RawMessage(output)
		}
		c, err := s.client(ctx, phase.Config{})
		if err != nil {
			return err
		}
		_, err = c.Resolve(s.acting(ctx), tenant, key, r, seen.list()...)
		err = refused(err, tenant, key)
		var changed *changedError
		switch {
		case errors.As(err, &changed):
			return err
		case errors.Is(err, keyrow.ErrNotFound):
			return &notFoundError{tenant: tenant, key: key}
		case errors.Is(err, keyrow.ErrNotUnknown):
			return fmt.Errorf("key %q of tenant %q is not held as unknown at recovery point %q with its lease free; inspect it again",
				key, tenant, r.RecoveryPoint)
		case err != nil:
			return err
		}
		if s.json {
			return s.writeJSON(resolveReport{tenant, key, r})
		}
		what := "did not happen: the call is made again with the same downstream key"
		if r.Happened {
			what = "happened: its output is recorded by the phase's record function"
		}
		_, err = fmt.Fprintf(s.stdout, "key %s of tenant %s: the call after %s %s.\n"+
			"The application's completer acts on it at its next pass over the key.\n",
			clean(key), clean(tenant), clean(r.RecoveryPoint), what)
		return err
	}
}

// bulkReport is what bulk prints: with Applied false, the preview.
type bulkReport struct {
	Action  string `json:"action"`
	Applied bool   `json:"applied"`
	Keys    int    `json:"keys"`
}

func defineBulk(fs *flag.FlagSet) action {
	f := defineFilter(fs)
	retry := fs.Bool("retry", false, "retry the selected keys on hold")
	unlock := fs.Bool("unlock", false, "free the leases of the selected keys")
	yes := fs.Bool("yes", false, "act; without it, only count the keys that would change")
	confirmUnknown := fs.Bool("confirm-unknown", false, "with -retry: retry keys held as unknown too, repeating their last foreign call")
	fs.IntVar(&f.Limit, "limit", 1000, "the most keys to change, at most 1000")
	return func(ctx context.Context, s *session, _ []string) error {
		if err := f.check(fs); err != nil {
			return err
		}
		var act string
		switch {
		case *retry == *unlock:
			return usagef("pass exactly one of -retry and -unlock")
		case *retry:
			act = keyrow.ActionRetry
		default:
			act = keyrow.ActionUnlock
		}
		switch {
		case *confirmUnknown && !*retry:
			return usagef("-confirm-unknown applies only to -retry")
		case f.Limit <= 0 || f.Limit > 1000:
			return usagef("-limit must be between 1 and 1000")
		}
		c, err := s.client(ctx, phase.Config{Completer: recovery.CompleterConfig{StuckAfter: minIdle(f.StuckAfter)}})
		if err != nil {
			return err
		}
		report := bulkReport{Action: act, Applied: *yes}
		if *yes {
			report.Keys, err = c.Bulk(s.acting(ctx), act, f.ListFilter, *confirmUnknown)
		} else {
			report.Keys, err = c.BulkPreview(ctx, act, f.ListFilter, *confirmUnknown)
		}
		if err != nil {
			return err
		}
		if s.json {
			return s.writeJSON(report)
		}
		if !*yes {
			_, err = fmt.Fprintf(s.stdout, "%d keys would change; pass -yes to %s them\n", report.Keys, act)
			return err
		}
		_, err = fmt.Fprintf(s.stdout, "%s: %d keys changed\n", act, report.Keys)
		return err
	}
}

func defineAudit(fs *flag.FlagSet) action {
	limit := fs.Int("limit", keyrow.DefaultListLimit, "the most entries to show")
	before := fs.Int64("before", 0, "show the entries before this `id`")
	return func(ctx context.Context, s *session, _ []string) error {
		if *limit <= 0 || *before < 0 {
			return usagef("-limit must be positive and -before not negative")
		}
		c, err := s.client(ctx, phase.Config{})
		if err != nil {
			return err
		}
		entries, err := c.Audit(ctx, keyrow.AuditFilter{Before: *before, Limit: *limit})
		if err != nil {
			return err
		}
		if s.json {
			return s.writeJSON(entries)
		}
		return printAudit(s.stdout, entries)
	}
}

func printAudit(w io.Writer, entries []keyrow.AuditEntry) error {
	if len(entries) == 0 {
		_, err := fmt.Fprintln(w, "no operator actions recorded")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tAT\tACTOR\tACTION\tTENANT\tKEY\tBEFORE\tAFTER")
	for _, e := range entries {
		action := e.Action
		if e.Refused != "" {
			action += " (refused: " + clean(e.Refused) + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.At.UTC().Format(time.RFC3339), clean(e.Actor), action,
			clean(e.Tenant), clean(e.Key), standing(e.Before, e.At), standing(e.After, e.At))
	}
	return tw.Flush()
}

// standing summarises an audit snapshot taken at at: recovery point, hold,
// and "leased" when a lease had not run out then (a lease that ran out is
// free, as inspect says, though its expiry is still stored).
func standing(snapshot json.RawMessage, at time.Time) string {
	var v struct {
		RecoveryPoint  string             `json:"recovery_point"`
		Hold           *string            `json:"hold"`
		LeaseExpiresAt *time.Time         `json:"lock_expires_at"`
		Resolution     *keyrow.Resolution `json:"resolution"`
	}
	if json.Unmarshal(snapshot, &v) != nil {
		return "?"
	}
	parts := []string{clean(v.RecoveryPoint)}
	if v.Hold != nil {
		parts = append(parts, *v.Hold)
	}
	if v.LeaseExpiresAt != nil && v.LeaseExpiresAt.After(at) {
		parts = append(parts, "leased")
	}
	if v.Resolution != nil {
		parts = append(parts, map[bool]string{true: "resolved:happened", false: "resolved:not-happened"}[v.Resolution.Happened])
	}
	return strings.Join(parts, ",")
}
