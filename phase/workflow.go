package phase

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/keyrow"
)

// Workflow is a named, ordered list of phases over a request type and a
// state type. The declared order defines the recovery points. After a
// phase commits, the key's recovery point is that phase's identity: its
// name, unless declared with [Phase.Formerly]. A resumed run starts at the
// phase after it.
//
// Req and State are stored as JSON: the request when the key is first
// seen, the state with every phase. Both must survive a round trip through
// encoding/json, because the completer rebuilds them from what is stored.
//
// # Definitions
//
// A key records the definition it started under (see [Workflow.Definition]).
// Only a process that registered that definition, or a workflow that
// adopts it (see [Workflow.Adopt]), runs it again. So a deploy that adds,
// removes or reorders phases never resumes a key with a phase list it did
// not start with, unless its author said how. See
// docs/changing-a-workflow.md.
type Workflow[Req, State any] struct {
	name   string
	phases []Phase[Req, State]
	// index maps each phase's identity to its position.
	index      map[string]int
	definition string
	adoptions  []adoption
	store      storePolicy
}

// adoption is an older definition whose keys a workflow resumes, with the
// recovery points they move to.
type adoption struct {
	workflow, definition string
	moves                map[string]string
}

// NewWorkflow declares a workflow. Names must be unique, non-empty and not
// one of the reserved recovery points (keyrow.Started, keyrow.Finished).
// At least one phase is required.
func NewWorkflow[Req, State any](name string, phases ...Phase[Req, State]) (*Workflow[Req, State], error) {
	if err := keyrow.CheckName(name); err != nil {
		return nil, fmt.Errorf("phase: workflow name %w", err)
	}
	if len(phases) == 0 {
		return nil, fmt.Errorf("phase: workflow %q has no phases", name)
	}
	w := &Workflow[Req, State]{name: name, phases: phases, index: make(map[string]int, len(phases)),
		store: defaultStorePolicy()}
	for i, p := range phases {
		switch {
		case keyrow.CheckName(p.name) != nil:
			return nil, fmt.Errorf("phase: workflow %q: phase %d: name %w", name, i, keyrow.CheckName(p.name))
		case p.id != "" && keyrow.CheckName(p.id) != nil:
			return nil, fmt.Errorf("phase: workflow %q: phase %q: former name %w", name, p.name, keyrow.CheckName(p.id))
		case isReserved(p.name) || isReserved(p.id):
			return nil, fmt.Errorf("phase: workflow %q: %q is a reserved recovery point", name, p.identity())
		case p.local == nil && p.foreign == nil:
			return nil, fmt.Errorf("phase: workflow %q: phase %q has no function; declare it with Local or Foreign", name, p.name)
		case p.err != nil:
			return nil, fmt.Errorf("phase: workflow %q: phase %q: %w", name, p.name, p.err)
		}
		if _, dup := w.index[p.identity()]; dup {
			return nil, fmt.Errorf("phase: workflow %q: phase %q declared twice", name, p.identity())
		}
		w.index[p.identity()] = i
	}
	w.definition = definitionOf(phases)
	return w, nil
}

func isReserved(name string) bool { return name == keyrow.Started || name == keyrow.Finished }

// definitionOf hashes what a key's recovery depends on: each phase's
// identity, in order, with its kind and the choices that decide what a run
// after a crash does (repeatable, reconciled, conditional). Code inside a
// phase is not part of it, so a fix to a phase's body keeps the definition.
func definitionOf[Req, State any](phases []Phase[Req, State]) string {
	h := sha256.New()
	h.Write([]byte("atomicphase/definition/v1\x00"))
	for _, p := range phases {
		h.Write([]byte(p.identity()))
		flags := []byte{0, 'l', '-', '-', '-'}
		if p.foreign != nil {
			flags[1] = 'f'
			if p.foreign.repeatable {
				flags[2] = 'r'
			}
			if p.foreign.reconcile != nil {
				flags[3] = 'c'
			}
		}
		if p.when != nil {
			flags[4] = 'w'
		}
		h.Write(flags)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Definition returns the identity of w's definition. It is a hash of the
// phase identities in order, each with its kind (local or foreign) and
// whether it is Repeatable, Reconciled or conditional (When).
//
// Every key records the definition it started under. A process resumes a
// key only under that definition, or under a workflow that adopts it (see
// [Workflow.Adopt]).
//
//   - Renaming a phase with Formerly, or changing the code inside a phase,
//     keeps the definition.
//   - Adding, removing or reordering phases, or changing one of those
//     choices, makes a new one.
func (w *Workflow[Req, State]) Definition() string { return w.definition }

// Adopt declares that w resumes the unfinished keys that started under
// definition of workflow, so they need not drain on the old code. workflow
// is w's own name, or the name w had before a rename. Call Adopt before
// NewClient:
//
//	err := after.Adopt("orders", before.Definition(), nil)
//
// moves maps each recovery point of that definition that w does not have
// (a phase removed, or renamed without Formerly) to the recovery point of w
// to resume from, keyrow.Started included. Points not in moves resume from
// the phase of w with the same identity. A key whose recovery point w
// cannot place is left untouched. Its client is answered that a process
// running its definition must finish it.
//
// Adopting a definition says that running the rest of w after the old
// definition's committed phases is what the author wants. A phase added
// before a key's point is skipped by that key. A phase added after it is
// run.
func (w *Workflow[Req, State]) Adopt(workflow, definition string, moves map[string]string) error {
	if err := keyrow.CheckName(workflow); err != nil {
		return fmt.Errorf("phase: Adopt: workflow name %w", err)
	}
	if workflow == w.name && definition == w.definition {
		return fmt.Errorf("phase: Adopt: %q is workflow %q's own definition", definition, w.name)
	}
	for from, to := range moves {
		if _, ok := w.index[to]; !ok && to != keyrow.Started {
			return fmt.Errorf("phase: Adopt: recovery point %q moves to %q, which workflow %q does not have", from, to, w.name)
		}
	}
	w.adoptions = append(w.adoptions, adoption{workflow: workflow, definition: definition, moves: maps.Clone(moves)})
	return nil
}

// Name returns the workflow's name, stored with every key it runs.
func (w *Workflow[Req, State]) Name() string { return w.name }

// Phases returns the phases' recovery points in declared order: the
// workflow's recovery points between keyrow.Started and keyrow.Finished.
// A phase's recovery point is its name, or the name given to Formerly.
func (w *Workflow[Req, State]) Phases() []string {
	names := make([]string, len(w.phases))
	for i, p := range w.phases {
		names[i] = p.identity()
	}
	return names
}

// next returns the index of the first phase to run after recovery point rp.
func (w *Workflow[Req, State]) next(rp string) (int, error) {
	if rp == keyrow.Started {
		return 0, nil
	}
	i, ok := w.index[rp]
	if !ok {
		return 0, fmt.Errorf("%w: workflow %q (definition %s) has no recovery point %q", ErrDefinitionElsewhere, w.name, w.definition, rp)
	}
	return i + 1, nil
}

// Input is what a phase is given: the request, the typed state committed by
// earlier phases, and the key it runs under.
type Input[Req, State any] struct {
	// Req is the decoded request. Phases must treat it as read-only.
	Req Req
	// State is the workflow state. A phase may change it; the change is
	// committed with the phase, and discarded if the phase fails.
	State State

	// Tenant and Key identify the idempotency key.
	Tenant string
	Key    string
	// ID is the key row's id.
	ID uuid.UUID
	// Attempt counts the runs that took the key's lease, this one included.
	Attempt int
	// Resumed is true when this run continues an earlier, interrupted one.
	Resumed bool

	// downstream starts every downstream key of this run, made from
	// downstreamOf once asked for: most runs of local phases never are.
	downstreamOf   downstreamOf
	downstreamOnce sync.Once
	downstream     string
	phase          string
}

// downstreamOf is what a run's downstream keys are made of (see
// keyrow.DownstreamKey).
type downstreamOf struct {
	prefix, tenant, key string
	fingerprint         []byte
}

// DownstreamKey returns the idempotency key to send with this phase's foreign
// call (see keyrow.DownstreamKey): the same on every retry and in every
// process, even after the key row was lost to a failover, and different for
// every key, request and phase. It is safe for concurrent use.
func (r *Input[Req, State]) DownstreamKey() string {
	return r.downstreamBase() + r.phase
}

// downstreamBase is the part of the run's downstream keys before the phase.
func (r *Input[Req, State]) downstreamBase() string {
	r.downstreamOnce.Do(func() {
		d := r.downstreamOf
		r.downstream = keyrow.DownstreamKey(d.prefix, d.tenant, d.key, d.fingerprint, "")
	})
	return r.downstream
}

// Result is how a phase ends when it does not fail: by moving on (Next), or
// by answering the request (Respond, JSON).
type Result struct {
	response *keyrow.Response
	err      error
}

// Next ends a phase by committing it and moving to the next applicable one.
func Next() Result { return Result{} }

// Respond ends the workflow with a terminal response, whatever its status.
// The caller that ran the request gets it whole. The key stores its status
// and body, byte for byte, in the phase's commit, with the headers that
// describe the resource (see [Workflow.StoreResponses]). Every retry of
// the key gets that back.
func Respond(status int, header http.Header, body []byte) Result {
	if body == nil {
		body = []byte{}
	}
	return Result{response: &keyrow.Response{Status: status, Header: header.Clone(), Body: body}}
}

// JSON ends the workflow with a terminal JSON response of v.
func JSON(status int, v any) Result {
	body, err := json.Marshal(v)
	if err != nil {
		return Result{err: fmt.Errorf("phase: encode response: %w", err)}
	}
	return Result{response: &keyrow.Response{Status: status,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: append(body, '\n')}}
}

// LocalFunc is the body of a local phase: database work in tx only.
type LocalFunc[Req, State any] func(ctx context.Context, tx pgx.Tx, in *Input[Req, State]) (Result, error)

// CallFunc makes a phase's one foreign call. It runs outside any database
// transaction and must send in.DownstreamKey() as the call's idempotency key.
type CallFunc[Req, State, Out any] func(ctx context.Context, in *Input[Req, State]) (Out, error)

// RecordFunc records a foreign call's outcome in tx, in the transaction that
// commits the phase.
type RecordFunc[Req, State, Out any] func(ctx context.Context, tx pgx.Tx, in *Input[Req, State], out Out) (Result, error)

// ReconcileFunc finds out what became of a foreign call whose outcome is
// unknown, typically by looking the call up by in.DownstreamKey(). It
// returns the call's output and Happened when the call happened, or
// NotHappened when it provably did not and may be made again.
type ReconcileFunc[Req, State, Out any] func(ctx context.Context, in *Input[Req, State]) (Out, Verdict, error)

// Verdict is what a reconciliation concluded.
type Verdict int

// The verdicts a ReconcileFunc may return.
const (
	// Pending: still unknown; the key stays on hold and the completer asks
	// again later.
	Pending Verdict = iota
	// Happened: the call happened; its output is recorded and the run goes
	// on.
	Happened
	// NotHappened: the call provably did not happen; the run makes it now.
	NotHappened
)

// Phase is one atomic phase: a single database transaction that commits at
// most one foreign side effect and advances the recovery point. Declare one
// with Local or Foreign.
type Phase[Req, State any] struct {
	name string
	// id is the identity given by Formerly; empty means the name.
	id        string
	local     LocalFunc[Req, State]
	foreign   *foreignPhase[Req, State]
	when      func(in *Input[Req, State]) bool
	isolation pgx.TxIsoLevel
	// err records a misuse in the declaration, reported by New.
	err error
}

type foreignPhase[Req, State any] struct {
	// call makes the call and returns a function that records its outcome.
	call      func(ctx context.Context, in *Input[Req, State]) (recordFn[Req, State], error)
	reconcile func(ctx context.Context, in *Input[Req, State]) (recordFn[Req, State], Verdict, error)
	// decode turns an operator's JSON for the call's output into the
	// record of it (see Client.Resolve).
	decode     func(output []byte) (recordFn[Req, State], error)
	repeatable bool
}

type recordFn[Req, State any] func(ctx context.Context, tx pgx.Tx, in *Input[Req, State]) (Result, error)

// Local declares a phase of database work only: fn runs in one transaction
// that also advances the recovery point.
func Local[Req, State any](name string, fn LocalFunc[Req, State]) Phase[Req, State] {
	return Phase[Req, State]{name: name, local: fn}
}

// Foreign declares a phase with exactly one foreign call. call runs outside
// any open transaction, with the lease renewed while it runs. record then
// commits its outcome and advances, in one short transaction.
//
// When the run stops between the call and the commit (a crash, an outage,
// a lost lease), whether the call happened is unknown:
//
//   - A Repeatable phase is called again with the same downstream key.
//   - Any other phase is never called again blindly. Before its call, the
//     run records on the key that the call may be under way (one statement
//     that also renews the lease). The next run that finds that record
//     reconciles the call with the phase's reconcile function (see
//     [Reconciled]). Without one, it puts the key on hold for an operator.
//
// A call that returns an error other than an unknown outcome (see
// [MaybeHappened]) is taken to have not happened, and the next run calls
// again.
func Foreign[Req, State, Out any](name string, call CallFunc[Req, State, Out], record RecordFunc[Req, State, Out]) Phase[Req, State] {
	bind := func(out Out) recordFn[Req, State] {
		return func(ctx context.Context, tx pgx.Tx, in *Input[Req, State]) (Result, error) {
			return record(ctx, tx, in, out)
		}
	}
	return Phase[Req, State]{name: name, foreign: &foreignPhase[Req, State]{
		call: func(ctx context.Context, in *Input[Req, State]) (recordFn[Req, State], error) {
			out, err := call(ctx, in)
			if err != nil {
				return nil, err
			}
			return bind(out), nil
		},
		decode: func(output []byte) (recordFn[Req, State], error) {
			out, err := decodeOutput[Out](output)
			if err != nil {
				return nil, err
			}
			return bind(out), nil
		},
	}}
}

// Reconciled returns p, a foreign phase, with fn as the way to resolve a
// call whose outcome is unknown (see MaybeHappened). A run that resumes a
// key whose call may have been sent calls it first; a key it leaves on hold
// is refused to every later run but the completer's, which calls it again,
// so processes that run the workflow run the completer too (Client.Start).
func Reconciled[Req, State, Out any](p Phase[Req, State], fn ReconcileFunc[Req, State, Out], record RecordFunc[Req, State, Out]) Phase[Req, State] {
	if p.foreign == nil {
		p.err = errors.New("only a foreign phase can be reconciled")
		return p
	}
	f := *p.foreign
	f.reconcile = func(ctx context.Context, in *Input[Req, State]) (recordFn[Req, State], Verdict, error) {
		out, res, err := fn(ctx, in)
		if err != nil || res != Happened {
			return nil, res, err
		}
		return func(ctx context.Context, tx pgx.Tx, in *Input[Req, State]) (Result, error) {
			return record(ctx, tx, in, out)
		}, Happened, nil
	}
	p.foreign = &f
	return p
}

// Repeatable declares that p's foreign call is safe to repeat when its
// outcome is unknown, because the provider honours the downstream
// idempotency key (as Stripe does). An unknown outcome then leaves the key
// resumable. The next run repeats the call instead of holding the key for
// reconciliation.
func (p Phase[Req, State]) Repeatable() Phase[Req, State] {
	if p.foreign == nil {
		p.err = errors.New("only a foreign phase can be repeatable")
		return p
	}
	f := *p.foreign
	f.repeatable = true
	p.foreign = &f
	return p
}

// When makes p apply only to runs for which pred is true; other runs pass
// over it without a transaction and without changing the recovery point.
// pred must depend only on the request and committed state, so every run of
// a key decides the same way.
func (p Phase[Req, State]) When(pred func(in *Input[Req, State]) bool) Phase[Req, State] {
	p.when = pred
	return p
}

// Isolation runs p's transaction at level (default: the database's, usually
// read committed). Serialization failures and deadlocks are retried.
func (p Phase[Req, State]) Isolation(level pgx.TxIsoLevel) Phase[Req, State] {
	p.isolation = level
	return p
}

// Name returns the phase's name.
func (p Phase[Req, State]) Name() string { return p.name }

// Formerly declares that p was renamed from name. p keeps name as its
// identity, which is its recovery point and the end of its downstream keys:
//
//	phase.Local("welcome_sent", sendWelcome).Formerly("mailed")
//
// Keys in flight at the old name resume at p, and the workflow's
// definition is unchanged. A foreign call that may already have been made
// under the old name is repeated, or reconciled, with the same downstream
// key. Chain renames by keeping the first name.
func (p Phase[Req, State]) Formerly(name string) Phase[Req, State] {
	p.id = name
	return p
}

// identity is p's recovery point and the suffix of its downstream keys.
func (p *Phase[Req, State]) identity() string {
	if p.id != "" {
		return p.id
	}
	return p.name
}

// MaybeHappened wraps err, returned by a foreign call, to say the call may
// have taken effect. A Repeatable phase is then retried with the same
// downstream key; any other phase's key is held for reconciliation.
func MaybeHappened(err error) error {
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}
