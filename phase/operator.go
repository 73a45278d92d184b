package phase

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// WithActor returns ctx naming who performs the operator actions made with
// it (Unlock, Hold, Retry, Resolve, Bulk), for the audit that records each of
// them. Actions made without one are recorded as by "unnamed". An actor
// is recorded whatever text it holds, a NUL escaped as \0 and bytes that
// are not UTF-8 as U+FFFD.
func WithActor(ctx context.Context, actor string) context.Context {
	return store.WithActor(ctx, actor)
}

// Overview is the state of every key at a glance, as an operator's first
// page shows it.
type Overview struct {
	// Workflows counts each workflow's keys by state (see
	// Client.CountsByWorkflow).
	Workflows map[string]keyrow.Counts
	// OldestUnfinished is how long ago the oldest unfinished key not on hold
	// (in flight, waiting or stuck) was first seen; zero when there is none.
	OldestUnfinished time.Duration
	// LastHour counts the keys first seen in the last hour.
	LastHour int
	// Minutes are the last hour's minutes, oldest first, the current one
	// last: what happened to the keys in each.
	Minutes []Minute
	// History is the last hour's unfinished keys of each workflow by
	// status, as the completers recorded them (see Client.History).
	History []StatusMinute
	// Backlog is the stuck and waiting keys of every workflow and how fast
	// they drain (see Client.Backlog).
	Backlog Backlog
}

// Minute is what happened to the keys in one minute, read through indexes
// that hold only that hour's rows, however many keys the table holds.
type Minute struct {
	At time.Time
	// Started counts the keys first seen, Finished those that stored
	// their response, and Held those put on hold for an operator (dead
	// or unknown, and still so).
	Started, Finished, Held int
}

// CountsByWorkflow returns the keys of each workflow by state, a key
// counting as stuck once idle for the completer's StuckAfter. Like Counts, it
// counts the unfinished keys exactly, without reading a finished one (see
// docs/operating.md, "How the completer finds crashed keys"), and the
// finished keys of a large table from its statistics.
func (c *Client) CountsByWorkflow(ctx context.Context) (map[string]keyrow.Counts, error) {
	return store.CountByWorkflow(ctx, c.db, c.cfg.Completer.StuckAfter)
}

// Overview returns the counts of every workflow, the age of the oldest
// unfinished key not on hold, the keys of the last hour, the status
// history of the last hour and the backlog. None of it reads the finished keys of a large
// table.
func (c *Client) Overview(ctx context.Context) (*Overview, error) {
	counts, err := c.CountsByWorkflow(ctx)
	if err != nil {
		return nil, err
	}
	oldest, lastHour, err := store.Activity(ctx, c.db)
	if err != nil {
		return nil, err
	}
	workflows := slices.Collect(maps.Keys(counts))
	minutes, err := store.Minutes(ctx, c.db, time.Hour, workflows)
	if err != nil {
		return nil, err
	}
	history, err := c.History(ctx, time.Hour)
	if err != nil {
		return nil, err
	}
	var all keyrow.Counts
	for _, n := range counts {
		all = all.Add(n)
	}
	backlog, err := c.BacklogOf(ctx, all)
	if err != nil {
		return nil, err
	}
	o := &Overview{Workflows: counts, OldestUnfinished: oldest, LastHour: lastHour, Minutes: make([]Minute, len(minutes)),
		History: history, Backlog: backlog}
	for i, m := range minutes {
		o.Minutes[i] = Minute(m)
	}
	return o, nil
}

// KeyDetail is everything an operator sees of one key: its row, where it
// stands in its workflow, and the operator actions taken on it.
type KeyDetail struct {
	keyrow.Row
	// Phases are the workflow's phases in declared order when the
	// workflow is registered with the client; nil otherwise.
	Phases []PhaseDetail
	// Audit holds the operator actions on the key, newest first (at most
	// keyrow.DefaultListLimit of them).
	Audit []keyrow.AuditEntry
}

// PhaseDetail is one phase of a key's workflow.
type PhaseDetail struct {
	Name string
	// Foreign is set for a phase that makes a foreign call;
	// DownstreamKey is the idempotency key that call sends for this key.
	Foreign       bool
	DownstreamKey string
	// Passed is set for the phases up to the key's recovery point: each
	// committed, or did not apply to this key's request.
	Passed bool
}

// Describe returns everything stored about the tenant's key with the
// phases of its workflow and its audit, or keyrow.ErrNotFound.
func (c *Client) Describe(ctx context.Context, tenant, key string) (*KeyDetail, error) {
	row, err := store.Inspect(ctx, c.db, tenant, key)
	if err != nil {
		return nil, err
	}
	d := &KeyDetail{Row: *row}
	if d.Audit, err = store.Audit(ctx, c.db, keyrow.AuditFilter{Tenant: tenant, Key: key}); err != nil {
		return nil, err
	}
	w, ok := c.describer(row)
	if !ok {
		return d, nil
	}
	fp, err := store.Fingerprint(ctx, c.db, tenant, key)
	if err != nil {
		return nil, err
	}
	names, foreign := w.phaseKinds()
	passed := slices.Index(names, row.RecoveryPoint)
	if row.RecoveryPoint == keyrow.Finished {
		passed = len(names)
	}
	for i, name := range names {
		p := PhaseDetail{Name: name, Foreign: foreign[i], Passed: i <= passed}
		if p.Foreign {
			p.DownstreamKey = keyrow.DownstreamKey(c.cfg.DownstreamKeyPrefix, tenant, key, fp, name)
		}
		d.Phases = append(d.Phases, p)
	}
	return d, nil
}

// describer returns the registered workflow that runs row's definition as
// its own; an adopted definition, whose recovery points the run maps
// first, is not described.
func (c *Client) describer(row *keyrow.Row) (described, bool) {
	rt, ok := c.routes[defKey{row.Workflow, row.Definition}]
	if !ok || len(rt.moves) > 0 {
		return nil, false
	}
	w, ok := rt.w.(described)
	return w, ok
}

// described is what Describe and Resolve need of a registered workflow.
type described interface {
	phaseKinds() (names []string, foreign []bool)
	checkOutput(row *keyrow.Row, output json.RawMessage) (phase string, err error)
}

func (w *Workflow[Req, State]) phaseKinds() ([]string, []bool) {
	foreign := make([]bool, len(w.phases))
	for i := range w.phases {
		foreign[i] = w.phases[i].foreign != nil
	}
	return w.Phases(), foreign
}

// checkOutput finds the foreign phase whose outcome row awaits, as a run
// of the key would, and decodes output into that phase's output type.
func (w *Workflow[Req, State]) checkOutput(row *keyrow.Row, output json.RawMessage) (string, error) {
	run := &Input[Req, State]{Tenant: row.Tenant, Key: row.Key, ID: row.ID, Attempt: row.Attempts, Resumed: true}
	if err := json.Unmarshal(row.Params, &run.Req); err != nil {
		return "", fmt.Errorf("decode stored request: %w", err)
	}
	if len(row.State) > 0 && !bytes.Equal(row.State, []byte("null")) {
		if err := json.Unmarshal(row.State, &run.State); err != nil {
			return "", fmt.Errorf("decode stored state: %w", err)
		}
	}
	i, err := w.next(row.RecoveryPoint)
	if err != nil {
		return "", err
	}
	x := &execution[Req, State]{w: w, run: run}
	if i, err = x.applicable(i); err != nil {
		return "", err
	}
	if removedCall(w, row.CallPending, i) {
		if output != nil {
			return row.CallPending, removedCallHappened(row.CallPending)
		}
		return row.CallPending, nil
	}
	if i == len(w.phases) || w.phases[i].foreign == nil {
		return "", fmt.Errorf("no foreign phase follows recovery point %q", row.RecoveryPoint)
	}
	p := &w.phases[i]
	if output != nil {
		if _, err := p.foreign.decode(output); err != nil {
			return p.name, fmt.Errorf("phase %s: output does not decode as its record function takes it: %w", p.name, err)
		}
	}
	return p.name, nil
}

// removedCall reports whether the call pending on a key, which may have
// been sent, is of a phase that w would not run next: a definition that
// adopted the key's removed the phase. w never makes that call again.
func removedCall[Req, State any](w *Workflow[Req, State], pending string, next int) bool {
	return pending != "" && (next == len(w.phases) || w.phases[next].identity() != pending)
}

// removedCallHappened is why a call that happened cannot be resolved in a
// definition that removed its phase.
func removedCallHappened(pending string) error {
	return fmt.Errorf("the call of phase %q happened, but this definition has no phase %q to record its output: "+
		"register the definition the key started under (Workflow.Definition) to finish it through that phase, "+
		"or Retry it to go on under this definition without recording the call", pending, pending)
}

// decodeOutput decodes an operator's JSON into a phase's output type,
// refusing fields the type does not have (a misspelt field would
// otherwise leave its value zero) and anything after the value.
func decodeOutput[Out any](data json.RawMessage) (Out, error) {
	var out Out
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return out, err
	}
	if dec.More() {
		return out, errors.New("more than one JSON value")
	}
	return out, nil
}

// Resolve records an operator's resolution of the key's unknown outcome
// and, when the key's workflow is registered with the client, runs the key
// at once: a call that Happened is recorded with r.Output by the phase's
// record function (the one given to Foreign), one that did not is made
// again with the same downstream key. It returns the key as the run left
// it. A client without the workflow only records the resolution, and the
// completer of a process that has it acts on it at its next pass over the
// key.
//
// The resolution holds only while the key is held as unknown at
// r.RecoveryPoint with no live lease: otherwise nothing is recorded and
// the error is keyrow.ErrNotUnknown (the key moved on since the operator
// looked) or keyrow.ErrNotFound. Given what the operator saw of the key
// (Row.Seen, at most one), it is recorded only while the key is as seen,
// and replaces a pending resolution only when seen names it; given
// nothing, only while no resolution is pending. Otherwise the error is a
// *keyrow.ChangedError (errors.Is keyrow.ErrChanged) holding the key as it
// is now: of two resolutions made from the same view, exactly one is
// recorded.
//
// A key held inside the call of a phase that the definition running it
// removed (it adopted the key's definition) is resolved too: as not
// happened, the run goes on with the phases the definition has; as
// happened, the error wraps ErrInvalidResolution, since nothing can record
// the output: drain the key with its own definition registered, or Retry
// it.
//
// With the workflow registered, r.Output is first decoded into the
// phase's output type, unknown fields refused, and an error wrapping
// ErrInvalidResolution returned when it does not fit. The run decodes it
// again in any case, and keeps the key on hold if it does not fit. The
// resolution, or its refusal, is audited under the actor of ctx (see
// WithActor). A NUL in r.Output's strings, which Postgres cannot keep, is
// stored as the two characters \0, and bytes that are not UTF-8 as U+FFFD:
// the record function reads them so.
func (c *Client) Resolve(ctx context.Context, tenant, key string, r keyrow.Resolution, seen ...keyrow.Seen) (*keyrow.Row, error) {
	s, err := oneSeen(seen)
	if err != nil {
		return nil, err
	}
	row, err := store.Inspect(ctx, c.db, tenant, key)
	if err != nil {
		return nil, err
	}
	w, known := c.describer(row)
	if known && row.Hold == keyrow.HoldUnknown && row.RecoveryPoint == r.RecoveryPoint {
		var output json.RawMessage
		if r.Happened {
			output = r.Output
		}
		if _, err := w.checkOutput(row, output); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidResolution, err)
		}
	}
	if err := store.Resolve(ctx, c.db, tenant, key, r, s); err != nil {
		return nil, err
	}
	if known {
		if err := c.runNow(ctx, tenant, key); err != nil {
			c.cfg.Logger.Warn("resolved key did not finish its run; it stays for the completer",
				"workflow", row.Workflow, "tenant", tenant, "key", key, "err", err)
		}
	}
	return store.Inspect(ctx, c.db, tenant, key)
}

// runNow takes the lease on the key and runs it as the completer would,
// unless another run holds it.
func (c *Client) runNow(ctx context.Context, tenant, key string) error {
	if err := c.ready(ctx); err != nil {
		return err
	}
	if !c.enter() {
		return ErrStopped
	}
	defer c.exit()
	row, err := store.ClaimKey(ctx, c.db, tenant, key, c.cfg.LeaseTTL)
	if err != nil || row == nil {
		return err
	}
	row.Distributed = c.distributed.Load()
	_, err = c.resume(ctx, row)
	return err
}

// BulkPreview counts the keys that Bulk with the same arguments would
// change if it ran now, changing nothing.
func (c *Client) BulkPreview(ctx context.Context, action string, f keyrow.ListFilter, confirmUnknown bool) (int, error) {
	return store.BulkPreview(ctx, c.db, store.Bulk(action), c.filter(f), confirmUnknown)
}

// Bulk applies an operator action to every key f selects, up to f.Limit
// or 1000: keyrow.ActionRetry retries the dead keys among them (and those
// held as unknown when confirmUnknown is set, repeating their last foreign
// call), keyrow.ActionUnlock frees their leases. Each key changes as Retry
// or Unlock would change it, keys that a run holds locked at that moment
// are skipped, and each change is audited under the actor of ctx with the
// filter. It returns how many keys changed; BulkPreview counts them first.
func (c *Client) Bulk(ctx context.Context, action string, f keyrow.ListFilter, confirmUnknown bool) (int, error) {
	return store.BulkAct(ctx, c.db, store.Bulk(action), c.filter(f), confirmUnknown)
}

// filter applies the client's defaults to f.
func (c *Client) filter(f keyrow.ListFilter) keyrow.ListFilter {
	if f.StuckAfter == 0 {
		f.StuckAfter = c.cfg.Completer.StuckAfter
	}
	return f
}

// Audit returns the operator actions f selects, newest first. Each
// filter reads one index of the audit, a page at a time.
func (c *Client) Audit(ctx context.Context, f keyrow.AuditFilter) ([]keyrow.AuditEntry, error) {
	return store.Audit(ctx, c.db, f)
}

// StatusOf returns the keyrow.Status of k as it was read, named as Counts
// and ListFilter name it: an unfinished key neither held nor leased is
// waiting until it has been idle for the completer's StuckAfter, stuck after.
func (c *Client) StatusOf(k *keyrow.Row) keyrow.Status {
	return k.Status(c.cfg.Completer.StuckAfter, time.Now())
}

// CountMatching counts the keys f selects (its cursor and limit aside),
// up to upTo: a count of upTo means "upTo or more", so that counting a
// broad filter never reads a large table whole. A zero StuckAfter means
// the completer's StuckAfter.
func (c *Client) CountMatching(ctx context.Context, f keyrow.ListFilter, upTo int) (int, error) {
	return store.CountMatching(ctx, c.db, c.filter(f), upTo)
}

// resolved acts on an operator's resolution, when one was recorded for
// the key at its recovery point, of the unknown outcome of the phase at
// index i: it records the call's output (Happened) or makes the call again
// (not happened), and reports done. When the call pending on the key is of
// a phase this definition removed, a call that did not happen lets the run
// go on from i, and one that happened keeps the key on hold: nothing here
// can record it. The resolution is taken off the key first, so it is acted
// on once.
func (x *execution[Req, State]) resolved(ctx context.Context, i int) (resp *keyrow.Response, done bool, err error) {
	r, err := store.TakeResolution(ctx, x.c.db, x.row.Holder())
	if err != nil {
		return nil, true, x.release(ctx, fmt.Errorf("phase: read the operator's resolution: %w", err), keyrow.HoldUnknown)
	}
	if r == nil || r.RecoveryPoint != x.rp {
		return nil, false, nil
	}
	if removedCall(x.w, x.row.CallPending, i) {
		x.c.cfg.Logger.Info("acting on the operator's resolution of a call this definition removed", "workflow", x.w.name,
			"tenant", x.run.Tenant, "key", x.run.Key, "phase", x.row.CallPending, "happened", r.Happened)
		if r.Happened {
			return nil, true, x.release(ctx, fmt.Errorf("%w: %w", ErrOutcomeUnknown, removedCallHappened(x.row.CallPending)), keyrow.HoldUnknown)
		}
		// The call did not happen and this definition never makes it:
		// go on with the phases it has.
		resp, err := x.from(ctx, i, nil)
		return resp, true, err
	}
	if i == len(x.w.phases) || x.w.phases[i].foreign == nil {
		return nil, false, nil
	}
	p := &x.w.phases[i]
	x.run.phase = p.identity()
	x.c.cfg.Logger.Info("acting on the operator's resolution", "workflow", x.w.name, "tenant", x.run.Tenant,
		"key", x.run.Key, "phase", p.name, "happened", r.Happened)
	if !r.Happened {
		resp, err := x.from(ctx, i, nil)
		return resp, true, err
	}
	rec, err := p.foreign.decode(r.Output)
	if err != nil {
		return nil, true, x.release(ctx, fmt.Errorf("phase %s: the operator's resolution does not decode: %w", p.name, err), keyrow.HoldUnknown)
	}
	resp, err = x.from(ctx, i, rec)
	return resp, true, err
}
