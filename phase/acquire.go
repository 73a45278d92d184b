package phase

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
)

// Run runs req under the key (tenant, key): it takes the key's lease with one
// statement, then replays, refuses, or runs the workflow from its stored
// recovery point. w must be registered with c.
//
// Errors: ErrNotRegistered; an error wrapping keyrow.ErrInvalidTenant,
// keyrow.ErrKeyInvalid or ErrInvalidRequest for a request that can never be
// stored; ErrStopped; ErrUnavailable (the store is unreachable or was lost:
// safe to retry); ErrTransactionPooler (see Client.Check); ErrRunTimeout;
// ErrCrash (an injected crash; the lease is kept); keyrow.ErrLeaseLost
// (another run took the key over); ErrOutcomeUnknown; a *PanicError; or the
// error of a failed phase. In every error case the recovery point of the
// last committed phase is kept and nothing is stored as the response.
//
// The request's fingerprint is taken over its JSON encoding (see
// keyrow.RequestFingerprint). The HTTP handler fingerprints the request as
// its client sent it instead, so that a change to Req cannot change it.
func (w *Workflow[Req, State]) Run(ctx context.Context, c *Client, tenant, key string, req Req) (*Outcome, error) {
	return w.runAs(ctx, c, tenant, key, req, nil)
}

// runAs is Run with the fingerprint of the request as sent, when there is
// one.
func (w *Workflow[Req, State]) runAs(ctx context.Context, c *Client, tenant, key string, req Req, fp *[32]byte) (*Outcome, error) {
	if len(c.hooks.runs) == 0 {
		var info RunInfo
		info.Tenant, info.Key = tenant, key
		return w.run(ctx, c, &info, req, fp)
	}
	info := &RunInfo{Workflow: w.name, Tenant: tenant, Key: key}
	return c.throughRun(ctx, info, func(ctx context.Context) (*Outcome, error) { return w.run(ctx, c, info, req, fp) })
}

// run is Run inside the client's run wrappers; it fills in info. Each step
// does one job: request checks what the key will store, admit lets the run
// in, acquire takes the key or answers without running, and start runs it.
func (w *Workflow[Req, State]) run(ctx context.Context, c *Client, info *RunInfo, req Req, sent *[32]byte) (*Outcome, error) {
	if err := c.registered(w); err != nil {
		return nil, err
	}
	kreq, err := w.request(c, info.Tenant, info.Key, req, sent)
	if err != nil {
		return nil, err
	}
	ctx, cancel, stop, err := c.admit(ctx, w.name, info.Tenant, info.Key)
	if err != nil {
		return nil, err
	}
	defer c.leave(cancel, stop)
	ctx, timed := c.timeLive(ctx)
	defer timed()
	// Known once admit has checked the pool.
	kreq.Distributed = c.distributed.Load()
	taken, out, err := w.acquire(ctx, c, info, &kreq)
	if out != nil || err != nil {
		return out, err
	}
	return w.start(ctx, c, info, taken, req, kreq.Params)
}

// request checks that req can be stored under (tenant, key) and returns
// what taking the key stores: req's JSON, and the fingerprint of the
// request as sent, or else of that JSON.
func (w *Workflow[Req, State]) request(c *Client, tenant, key string, req Req, sent *[32]byte) (store.Request, error) {
	if err := keyrow.CheckTenant(tenant); err != nil {
		return store.Request{}, err
	}
	if err := keyrow.CheckKey(key); err != nil {
		return store.Request{}, err
	}
	var params []byte
	if err := protect("encoding the request", "", func() (err error) {
		params, err = json.Marshal(req)
		return err
	}); err != nil {
		return store.Request{}, fmt.Errorf("phase: encode request: %w", err)
	}
	if hasNUL(params) {
		return store.Request{}, fmt.Errorf("%w: a string in the request holds a NUL character (\\u0000)", ErrInvalidRequest)
	}
	var fp [32]byte
	if sent != nil {
		fp = *sent
	} else {
		var err error
		if fp, err = keyrow.RequestFingerprint("", "application/json", params); err != nil {
			return store.Request{}, fmt.Errorf("phase: fingerprint request: %w", err)
		}
	}
	return store.Request{Tenant: tenant, Key: key, Workflow: w.name, Definition: w.definition,
		Fingerprint: fp, Params: params, TTL: c.cfg.LeaseTTL,
		Retention: cmp.Or(w.store.retention, c.cfg.Reaper.Retention)}, nil
}

// admit lets a run in unless the client is stopping, bounds it by
// RunTimeout and by Stop giving up on it, and checks the pool (once per
// client); leave, given cancel and stop, ends the run.
func (c *Client) admit(ctx context.Context, workflow, tenant, key string) (_ context.Context, cancel context.CancelFunc, stop func() bool, err error) {
	if !c.enter() {
		return nil, nil, nil, ErrStopped
	}
	ctx, cancel, stop = c.bound(ctx)
	if err := c.ready(ctx); err != nil {
		if !errors.Is(err, ErrTransactionPooler) {
			err = c.acquireFailed(ctx, workflow, tenant, key, err)
		}
		c.leave(cancel, stop)
		return nil, nil, nil, err
	}
	return ctx, cancel, stop, nil
}

// leave ends a run that admit let in.
func (c *Client) leave(cancel context.CancelFunc, stop func() bool) {
	stop()
	cancel()
	c.exit()
}

// taken is a key whose lease a run took.
type taken struct {
	row *store.Row
	// resumed is set for a key that was unfinished; rerouted for one that
	// runs under the definition it started with, another of the workflow's.
	resumed, rerouted bool
}

// acquire takes the key's lease with one statement, or returns the outcome
// of a run that runs nothing (a key that may be resumed is read by one
// statement and taken over by a second). A key is looked up at most twice
// more: under the fingerprint keys stored before definitions hold, and
// under the definition it started with. A key another run holds is waited
// for, up to WaitForInFlight.
func (w *Workflow[Req, State]) acquire(ctx context.Context, c *Client, info *RunInfo, kreq *store.Request) (taken, *Outcome, error) {
	legacyTried, rerouted := false, false
	var waitUntil time.Time
	if c.cfg.WaitForInFlight > 0 {
		waitUntil = time.Now().Add(c.cfg.WaitForInFlight)
	}
	pause := 10 * time.Millisecond
	for {
		kind, row, err := store.Acquire(ctx, c.db, *kreq)
		if err != nil {
			return taken{}, nil, c.acquireFailed(ctx, w.name, kreq.Tenant, kreq.Key, err)
		}
		info.RecoveryPoint = row.RecoveryPoint
		ev := keyrow.Event{Workflow: w.name, Tenant: kreq.Tenant, Key: kreq.Key, RecoveryPoint: row.RecoveryPoint}
		switch found := outcomeOf(kind); found {
		case OutcomeNew, OutcomeResumed:
			info.Attempt = row.Attempts
			return taken{row: row, resumed: found == OutcomeResumed, rerouted: rerouted}, nil, nil
		case OutcomeReplayed:
			ev.Status = row.Response.Status
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found, Response: w.store.replayed(row.Response)}), nil
		case OutcomeMismatch:
			if !legacyTried {
				// The key may hold the earlier kind of fingerprint, of its
				// workflow's name and the re-encoded request.
				legacyTried = true
				if legacy, err := keyrow.Fingerprint(row.Workflow, kreq.Params); err == nil && legacy != kreq.Fingerprint {
					kreq.Fingerprint = legacy
					continue
				}
			}
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found}), nil
		case OutcomeElsewhere:
			rt, ok := c.routes[defKey{row.Workflow, row.Definition}]
			switch {
			case ok && rt.w.Name() == w.name && !rerouted:
				// Another definition of this workflow that this process
				// runs or adopts: take the key under it.
				rerouted = true
				kreq.Workflow, kreq.Definition = row.Workflow, row.Definition
				continue
			case row.Workflow != w.name && (!ok || rt.w.Name() != w.name):
				// Another workflow's key, which this one does not adopt.
				return taken{}, c.refuse(ctx, ev, &Outcome{Kind: OutcomeMismatch}), nil
			}
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found, Definition: row.Definition, RetryAfter: lockttl.RetryAfter(0)}), nil
		case OutcomeOnHold:
			ev.Hold = row.Hold
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found, Hold: row.Hold, RetryAfter: lockttl.RetryAfter(0)}), nil
		case OutcomeInFlight:
			if left := time.Until(waitUntil); left > 0 {
				t := time.NewTimer(min(pause, left, row.LeaseLeft))
				select {
				case <-ctx.Done():
					t.Stop()
					return taken{}, nil, c.acquireFailed(ctx, w.name, kreq.Tenant, kreq.Key, ctx.Err())
				case <-t.C:
				}
				pause = min(2*pause, 500*time.Millisecond)
				continue
			}
			return taken{}, c.refuse(ctx, ev, &Outcome{Kind: found, RetryAfter: lockttl.RetryAfter(row.LeaseLeft), LeaseLeft: row.LeaseLeft}), nil
		default:
			return taken{}, nil, fmt.Errorf("phase: acquire: the store found the key %v, which this release does not know", kind)
		}
	}
}

// start runs a key the run took: the workflow's phases after its recovery
// point with req, or, for a key rerouted to the definition it started
// with, that definition's phases with the stored request.
func (w *Workflow[Req, State]) start(ctx context.Context, c *Client, info *RunInfo, k taken, req Req, params []byte) (*Outcome, error) {
	row := k.row
	var (
		resp *keyrow.Response
		err  error
	)
	if k.rerouted {
		if row.Params == nil {
			row.Params = params
		}
		rt := c.routes[defKey{row.Workflow, row.Definition}]
		resp, err = rt.w.resume(ctx, c, row, rt, false)
		if errors.Is(err, ErrDefinitionElsewhere) {
			return &Outcome{Kind: OutcomeElsewhere, Definition: row.Definition, RetryAfter: lockttl.RetryAfter(0)}, nil
		}
	} else {
		ev := keyrow.Event{Kind: keyrow.EventNew, Workflow: w.name, Tenant: info.Tenant, Key: info.Key, RecoveryPoint: row.RecoveryPoint}
		if k.resumed {
			ev.Kind = keyrow.EventResumed
		}
		c.observe(ctx, ev)
		row.Params = params
		in := &Input[Req, State]{Req: req, Tenant: info.Tenant, Key: info.Key, ID: row.ID, Attempt: row.Attempts,
			Resumed: k.resumed, downstreamOf: c.downstreamOf(row)}
		resp, err = w.execute(ctx, c, in, row, false)
	}
	if err != nil {
		return nil, err
	}
	out := &Outcome{Kind: OutcomeNew, Response: resp}
	if k.resumed {
		out.Kind = OutcomeResumed
	}
	return out, nil
}

// refuse ends a run that ran nothing with out, reporting ev as the event of
// out's kind.
func (c *Client) refuse(ctx context.Context, ev keyrow.Event, out *Outcome) *Outcome {
	ev.Kind = refusedEvents[out.Kind]
	c.observe(ctx, ev)
	return out
}

// acquireFailed classifies an error of taking the lease. Nothing was done.
func (c *Client) acquireFailed(ctx context.Context, workflow, tenant, key string, err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		return fmt.Errorf("%w: %w", ErrRunTimeout, err)
	case storeDown(err) || ctx.Err() != nil:
		c.cfg.Logger.Warn("idempotency key store unavailable", "workflow", workflow, "tenant", tenant, "key", key, "err", err)
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case preparedStatementLost(err):
		err = fmt.Errorf("%w: %w", ErrTransactionPooler, err)
	}
	c.cfg.Logger.Error("taking the key's lease failed", "workflow", workflow, "tenant", tenant, "key", key, "err", err)
	return fmt.Errorf("phase: acquire: %w", err)
}

// runContext bounds a run by RunTimeout and by Stop giving up on it.
func (c *Client) runContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel, stop := c.bound(ctx)
	return ctx, func() {
		stop()
		cancel()
	}
}

// bound returns ctx bounded by RunTimeout and cancelled when Stop gives up
// on runs; stop undoes the latter.
func (c *Client) bound(ctx context.Context) (_ context.Context, cancel context.CancelFunc, stop func() bool) {
	if c.cfg.RunTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RunTimeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	return ctx, cancel, context.AfterFunc(c.halt, cancel)
}

// downstreamOf is what the row's downstream keys are made of.
func (c *Client) downstreamOf(row *store.Row) downstreamOf {
	return downstreamOf{prefix: c.cfg.DownstreamKeyPrefix, tenant: row.Tenant, key: row.Key, fingerprint: row.Fingerprint}
}

func (w *Workflow[Req, State]) adopted() []adoption { return w.adoptions }

func (w *Workflow[Req, State]) retention() time.Duration { return w.store.retention }

// resume continues a key whose lease the caller holds, from its stored
// request: one the completer claimed, or one a request found under another
// definition. rt says how w runs the key's definition; byCompleter is set
// for the completer's runs.
func (w *Workflow[Req, State]) resume(ctx context.Context, c *Client, row *store.Row, rt route, byCompleter bool) (*keyrow.Response, error) {
	ctx, cancel := c.runContext(ctx)
	defer cancel()
	run := &Input[Req, State]{Tenant: row.Tenant, Key: row.Key, ID: row.ID, Attempt: row.Attempts,
		Resumed: true, downstreamOf: c.downstreamOf(row)}
	if err := json.Unmarshal(row.Params, &run.Req); err != nil {
		err = fmt.Errorf("phase: decode stored request: %w", err)
		c.release(ctx, row, err.Error(), row.Hold, failedBy(byCompleter), false)
		return nil, err
	}
	if rt.adopted {
		if err := w.adopt(ctx, c, row, rt.moves); err != nil {
			return nil, err
		}
	}
	c.observe(ctx, keyrow.Event{Kind: keyrow.EventResumed, Workflow: w.name, Tenant: row.Tenant, Key: row.Key, RecoveryPoint: row.RecoveryPoint})
	return w.execute(ctx, c, run, row, byCompleter)
}

// adopt moves a key of an adopted definition, whose lease the caller holds,
// to w's definition: its recovery point through moves, in one fenced write.
// A key at a point w cannot place is handed back untouched, with
// ErrDefinitionElsewhere, for a process that runs its definition.
func (w *Workflow[Req, State]) adopt(ctx context.Context, c *Client, row *store.Row, moves map[string]string) error {
	from, point := row.Definition, row.RecoveryPoint
	if to, ok := moves[point]; ok {
		point = to
	}
	if _, err := w.next(point); err != nil {
		err = fmt.Errorf("%w: definition %s at recovery point %q", ErrDefinitionElsewhere, from, row.RecoveryPoint)
		c.release(ctx, row, err.Error(), row.Hold, store.EndedIdle, false)
		c.cfg.Logger.Warn("key left for a process that runs its definition", "workflow", row.Workflow,
			"tenant", row.Tenant, "key", row.Key, "definition", from, "recovery_point", row.RecoveryPoint)
		return err
	}
	if err := store.Adopt(ctx, c.db, row.Holder(), w.definition, point); err != nil {
		if !errors.Is(err, keyrow.ErrLeaseLost) {
			c.release(ctx, row, err.Error(), row.Hold, store.EndedIdle, false)
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	c.cfg.Logger.Info("key adopted by a newer definition", "workflow", w.name, "tenant", row.Tenant, "key", row.Key,
		"from_definition", from, "definition", w.definition, "from_recovery_point", row.RecoveryPoint, "recovery_point", point)
	row.Definition, row.RecoveryPoint = w.definition, point
	return nil
}

// hasNUL reports whether encoding/json output holds an escaped NUL
// character, which jsonb refuses (SQLSTATE 22P05). encoding/json escapes
// every control character, so a NUL can only appear as \u0000, preceded by
// an odd number of backslashes.
func hasNUL(js []byte) bool {
	for i := bytes.Index(js, []byte(`\u0000`)); i >= 0; {
		n := 0
		for j := i - 1; j >= 0 && js[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return true
		}
		next := bytes.Index(js[i+1:], []byte(`\u0000`))
		if next < 0 {
			return false
		}
		i += 1 + next
	}
	return false
}
