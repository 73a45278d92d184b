package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/recovery"
)

// Widths past which text output shortens a value; -json never does.
const (
	bodyPreview  = 200
	errorPreview = 60
)

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

func printKey(w io.Writer, k *keyrow.Row, now time.Time) error {
	tw := newTable(w)
	row := func(label, value string) { fmt.Fprintf(tw, "%s\t%s\n", label, value) }
	row("tenant", clean(k.Tenant))
	row("key", clean(k.Key))
	row("id", k.ID.String())
	row("workflow", clean(k.Workflow))
	row("definition", orDash(clean(k.Definition)))
	row("status", status(k))
	row("recovery point", clean(k.RecoveryPoint))
	if k.CallPending != "" {
		row("call pending", clean(k.CallPending)+" (may have been sent; reconciled before it is sent again)")
	}
	row("attempts", strconv.Itoa(k.Attempts))
	row("failures", strconv.Itoa(k.Failures))
	row("last error", orDash(clean(k.LastError)))
	row("created", when(&k.CreatedAt, now))
	row("last run", when(&k.LastRunAt, now))
	row("finished", when(k.FinishedAt, now))
	switch {
	case k.LeaseLeft > 0:
		row("lease", fmt.Sprintf("%s left, taken %s", left(k.LeaseLeft), when(k.LeaseTakenAt, now)))
	case k.LeaseExpiresAt != nil:
		row("lease", "expired "+when(k.LeaseExpiresAt, now))
	default:
		row("lease", "free")
	}
	if k.Resolution != nil {
		row("resolution", clean(k.Resolution.String())+" (pending: the next run acts on it)")
	}
	row("params", compact(k.Params))
	row("state", compact(k.State))
	if k.ResponseStatus != nil {
		row("response", strconv.Itoa(*k.ResponseStatus))
		names := make([]string, 0, len(k.ResponseHeader))
		for name := range k.ResponseHeader {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			for _, v := range k.ResponseHeader[name] {
				row("", clean(name+": "+v))
			}
		}
		row("response body", preview(k.ResponseBody))
	}
	row("seen", k.Seen().String()+" (pass as -seen to unlock, hold, retry or resolve)")
	return tw.Flush()
}

func printList(w io.Writer, page keyrow.Page, f keyrow.ListFilter, now time.Time) error {
	keys := page.Keys
	which := string(f.Status)
	if len(keys) == 0 {
		if f.Status == keyrow.StatusStuck {
			_, err := fmt.Fprintf(w, "no stuck keys idle for more than %s\n", f.StuckAfter)
			return err
		}
		_, err := fmt.Fprintln(w, strings.Join(strings.Fields("no "+which+" keys"), " "))
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "TENANT\tKEY\tWORKFLOW\tRECOVERY POINT\tATTEMPTS\tIDLE\tLEASE\tLAST ERROR")
	for _, k := range keys {
		lease := "free"
		switch {
		case k.LeaseLeft > 0:
			lease = left(k.LeaseLeft) + " left"
		case k.LeaseExpiresAt != nil:
			lease = "expired"
		}
		// A finished key is not idle: nothing is left to run.
		idle := "-"
		if k.FinishedAt == nil {
			idle = since(k.LastRunAt, now)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n",
			clean(k.Tenant), clean(k.Key), clean(k.Workflow), clean(k.RecoveryPoint), k.Attempts,
			idle, lease, orDash(clean(shorten(oneLine(k.LastError), errorPreview))))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		_, err := fmt.Fprintf(w, "more keys follow; pass -after %s for the next page\n", page.Next)
		return err
	}
	return nil
}

func printHold(w io.Writer, k *keyrow.Row) error {
	name := fmt.Sprintf("key %s of tenant %s", clean(k.Key), clean(k.Tenant))
	var err error
	switch {
	case k.LeaseLeft > 0:
		_, err = fmt.Fprintf(w, "%s is on hold as dead at recovery point %s; its lease, with %s left, is cleared and its holder, if alive, is fenced out\n",
			name, clean(k.RecoveryPoint), left(k.LeaseLeft))
	default:
		_, err = fmt.Fprintf(w, "%s is on hold as dead at recovery point %s\n", name, clean(k.RecoveryPoint))
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, "nothing runs it until 'atomicphase retry' takes it off hold")
	return err
}

func printUnlock(w io.Writer, k *keyrow.Row, freed bool) error {
	name := fmt.Sprintf("key %s of tenant %s", clean(k.Key), clean(k.Tenant))
	var err error
	switch {
	case !freed:
		_, err = fmt.Fprintf(w, "%s had no lease; nothing changed\n", name)
		return err
	case k.LeaseLeft > 0:
		_, err = fmt.Fprintf(w, "freed the lease on %s with %s left; its holder, if alive, is fenced out\n", name, left(k.LeaseLeft))
	default:
		_, err = fmt.Fprintf(w, "freed the expired lease on %s\n", name)
	}
	if err != nil {
		return err
	}
	if k.Hold != "" {
		_, err = fmt.Fprintf(w, "it stays on hold (%s); see 'atomicphase retry -h'\n", k.Hold)
	} else {
		_, err = fmt.Fprintf(w, "the next request or the completer resumes it after recovery point %s\n", clean(k.RecoveryPoint))
	}
	return err
}

func printReap(w io.Writer, r reapReport) error {
	tw := newTable(w)
	if r.DryRun {
		fmt.Fprintf(tw, "dry run with retention %s: nothing was changed\n", r.Retention)
		fmt.Fprintf(tw, "abandoned keys to answer\t%d\n", r.Abandoned)
		fmt.Fprintf(tw, "finished keys to reap\t%d\n", r.Reaped)
	} else {
		fmt.Fprintf(tw, "reaped with retention %s\n", r.Retention)
		fmt.Fprintf(tw, "abandoned keys answered\t%d\n", r.Abandoned)
		fmt.Fprintf(tw, "finished keys reaped\t%d\n", r.Reaped)
	}
	return tw.Flush()
}

func printStats(w io.Writer, c keyrow.Counts, defs []keyrow.DefinitionCount, b phase.Backlog, stuckAfter time.Duration, now time.Time) error {
	tw := newTable(w)
	if c.FinishedEstimated {
		fmt.Fprintf(tw, "finished\t~%d\testimated from the table's statistics\n", c.Finished)
	} else {
		fmt.Fprintf(tw, "finished\t%d\n", c.Finished)
	}
	fmt.Fprintf(tw, "in flight\t%d\n", c.InFlight)
	fmt.Fprintf(tw, "waiting\t%d\tidle for at most %s\n", c.Waiting, stuckAfter)
	fmt.Fprintf(tw, "stuck\t%d\tidle for more than %s\n", c.Stuck, stuckAfter)
	fmt.Fprintf(tw, "unknown\t%d\n", c.Unknown)
	fmt.Fprintf(tw, "dead\t%d\n", c.Dead)
	fmt.Fprintf(tw, "total\t%d\n", c.Total())
	fmt.Fprintf(tw, "backlog\t%d\tkeys stuck or waiting, %s\n", b.Keys(), b.Rate())
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(defs) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nunfinished keys by workflow definition:")
	tw = newTable(w)
	fmt.Fprintf(tw, "WORKFLOW\tDEFINITION\tUNFINISHED\tON HOLD\tOLDEST\n")
	for _, d := range defs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", clean(d.Workflow), orDash(clean(d.Definition)), d.Unfinished, d.Held, since(d.Oldest, now))
	}
	return tw.Flush()
}

func printMigrate(w io.Writer, r migrateReport) error {
	if len(r.Applied) == 0 {
		_, err := fmt.Fprintf(w, "the schema is up to date at version %d\n", r.Version)
		return err
	}
	fmt.Fprintf(w, "migrated the schema from version %d to %d:\n", r.PreviousVersion, r.Version)
	for _, m := range r.Applied {
		fmt.Fprintf(w, "  %03d_%s\n", m.Version, m.Name)
	}
	return nil
}

func printMigrateStatus(w io.Writer, st migrateStatus) error {
	tw := newTable(w)
	fmt.Fprintf(tw, "version\t%d\n", st.Version)
	fmt.Fprintf(tw, "latest\t%d\n", st.Latest)
	switch {
	case st.Version > st.Latest:
		fmt.Fprintf(tw, "pending\tnone; the database is newer than this release, which refuses to migrate it\n")
	case len(st.Pending) == 0:
		fmt.Fprintf(tw, "pending\tnone\n")
	}
	for i, m := range st.Pending {
		label := ""
		if i == 0 {
			label = "pending"
		}
		fmt.Fprintf(tw, "%s\t%03d_%s\n", label, m.Version, m.Name)
	}
	return tw.Flush()
}

// printMigrations writes the migrations as one script, each headed by its
// file name.
func printMigrations(w io.Writer, ms []atomicphase.Migration) error {
	for i, m := range ms {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if _, err := fmt.Fprintf(w, "-- %03d_%s.up.sql\n%s", m.Version, m.Name, m.SQL); err != nil {
			return err
		}
		if !strings.HasSuffix(m.SQL, "\n") {
			fmt.Fprintln(w)
		}
	}
	return nil
}

// status names the status of a key as Counts and the list filter do.
func status(k *keyrow.Row) string {
	return string(k.Status(recovery.DefaultStuckAfter, time.Now()))
}

// clean makes s safe to print in a table: tenants, keys and errors come
// from clients and may hold tabs, newlines or terminal escapes, which are
// shown quoted instead; so is text with a space at either end, which a
// table would not show.
func clean(s string) string {
	if s != strings.TrimSpace(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shorten cuts s to at most n bytes, on a rune boundary, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func preview(body []byte) string {
	switch {
	case len(body) == 0:
		return "(empty)"
	case !utf8.Valid(body):
		return fmt.Sprintf("(%d bytes, not UTF-8; -json shows them base64-encoded)", len(body))
	case len(body) > bodyPreview:
		return clean(shorten(oneLine(string(body)), bodyPreview)) + fmt.Sprintf(" (%d bytes)", len(body))
	}
	return clean(oneLine(string(body)))
}

// compact prints stored JSON on one line; Postgres returns jsonb with
// spaces after separators.
func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return clean(string(raw))
	}
	return clean(b.String())
}

// when prints a time in UTC with how long ago it was, by this machine's
// clock.
func when(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	d := now.Sub(*t).Round(time.Second)
	if d < 0 {
		return fmt.Sprintf("%s (in %s)", t.UTC().Format(time.DateTime+" UTC"), -d)
	}
	return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.DateTime+" UTC"), d)
}

func since(t, now time.Time) string {
	return max(now.Sub(t).Round(time.Second), 0).String()
}

func left(d time.Duration) string {
	if d < time.Second {
		return "<1s"
	}
	return d.Round(time.Second).String()
}
