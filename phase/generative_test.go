package phase_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgcluster"
	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/internal/testenv"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/recovery"
)

// The environment variables of TestGenerativeWorkflowsKeepThePromises.
const (
	// generativeEnv runs that many seeds, from 1 on, instead of the
	// default list: the long mode (ATOMICPHASE_GENERATIVE=500).
	generativeEnv = "ATOMICPHASE_GENERATIVE"
	// generativeSeedEnv runs only the seeds it lists, comma-separated: the
	// way to reproduce a failure (ATOMICPHASE_GENERATIVE_SEED=1234).
	generativeSeedEnv = "ATOMICPHASE_GENERATIVE_SEED"
)

// generativeSeeds is the default budget, run by go test ./...: seeds 1 to
// 20, whose workflows together mix every kind of phase, When, isolation
// level, hook and recovery, and seed 29, whose Reconciled phase is followed
// by a local one, with the completer. They run in under a minute with
// -race on two cores.
var generativeSeeds = []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 29}

// TestGenerativeWorkflowsKeepThePromises builds random workflows (one to
// six phases, local and foreign, foreign ones Repeatable, Reconciled or
// neither, some conditional, at various isolation levels, with and without
// a PhaseWrapper, on the routes this machine has), runs each through
// phasetest's CrashMatrix and PairMatrix, and checks in Config.Check, for
// every converged scenario, the promises a workflow author relies on,
// counted independently of the library: how many times each foreign call
// was sent, reconciled or held, how many times each phase committed, and
// what the key was left with (see generativeCheck.scenario for the rules).
// Every failure names its seed; generativeSeedEnv reruns it.
func TestGenerativeWorkflowsKeepThePromises(t *testing.T) {
	t.Parallel()
	for _, seed := range generativeSeedList(t) {
		g := generate(seed)
		route := g.route()
		t.Run(fmt.Sprintf("seed=%d/%s/%s", seed, g, route.Name), func(t *testing.T) {
			t.Parallel()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("seed %d failed (%s); rerun it alone with: %s=%d go test -race -count=1 -run '^TestGenerativeWorkflowsKeepThePromises$' ./phase/",
						seed, g, generativeSeedEnv, seed)
				}
			})
			if route.Name != g.routeName && !pgtest.OnCitus() {
				t.Logf("seed %d asks for the %s route, which this machine lacks: it runs on %s", seed, g.routeName, route.Name)
			}
			runGenerated(t, g, route.PoolWith(t, nil))
		})
	}
}

// generativeSeedList returns the seeds to run: those of generativeSeedEnv,
// or the first generativeEnv, or the default budget.
func generativeSeedList(t *testing.T) []int64 {
	t.Helper()
	if v := os.Getenv(generativeSeedEnv); v != "" {
		var seeds []int64
		for _, s := range strings.Split(v, ",") {
			seed, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil {
				t.Fatalf("%s=%q: %v", generativeSeedEnv, v, err)
			}
			seeds = append(seeds, seed)
		}
		return seeds
	}
	if v := os.Getenv(generativeEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a number of seeds", generativeEnv, v)
		}
		seeds := make([]int64, n)
		for i := range seeds {
			seeds[i] = int64(i + 1)
		}
		return seeds
	}
	return generativeSeeds
}

// How a foreign phase's call is recovered when its outcome is unknown.
const (
	repeatable = "rep"  // Repeatable: sent again with the same downstream key
	reconciled = "rec"  // Reconciled: its reconcile function asks the provider
	unresolved = "hold" // neither: the key is held for an operator
)

// genPhase is one phase of a generated workflow.
type genPhase struct {
	name    string
	foreign string // "" for a local phase, else how its call is recovered
	// when, unless nil, makes the phase conditional on the flag set by an
	// earlier phase.
	when *genWhen
	// sets is the flag the phase sets when it commits, which later phases'
	// When may read.
	sets      bool
	isolation pgx.TxIsoLevel
	// applies says whether the phase runs for the workflow's request, as
	// the generator works it out from the When predicates and flags.
	applies bool
}

// genWhen is a When predicate: the phase at index on set its flag to want.
type genWhen struct {
	on   int
	want bool
}

// generated is a random workflow and how it is run, all decided by its
// seed.
type generated struct {
	seed   int64
	phases []genPhase
	// wrapper installs a PhaseWrapper on the client, which sends every
	// commit at once instead of holding it back.
	wrapper bool
	// completer recovers keys by the completer too (Config.WithCompleter).
	completer bool
	// routeName is the route the seed asks for: direct, pgbouncer or citus.
	routeName string
}

// generate builds the workflow of seed. The last phase has no When, so it
// always applies, and it responds.
func generate(seed int64) *generated {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x61746f6d6963))
	g := &generated{seed: seed, wrapper: rng.IntN(3) == 0, completer: rng.IntN(2) == 0}
	switch rng.IntN(5) {
	case 0:
		g.routeName = "pgbouncer"
	case 1:
		g.routeName = "citus"
	default:
		g.routeName = "direct"
	}
	n := 1 + rng.IntN(6)
	for i := range n {
		p := genPhase{name: fmt.Sprintf("p%d", i+1), sets: rng.IntN(2) == 0}
		if rng.IntN(2) == 0 {
			p.foreign = []string{repeatable, reconciled, unresolved}[rng.IntN(3)]
		}
		if i > 0 && i < n-1 && rng.IntN(3) == 0 {
			p.when = &genWhen{on: rng.IntN(i), want: rng.IntN(2) == 0}
		}
		switch rng.IntN(6) {
		case 0:
			p.isolation = pgx.ReadCommitted
		case 1:
			p.isolation = pgx.RepeatableRead
		case 2:
			p.isolation = pgx.Serializable
		}
		g.phases = append(g.phases, p)
	}
	for i := range g.phases {
		p := &g.phases[i]
		p.applies = p.when == nil || g.flag(p.when.on) == p.when.want
	}
	return g
}

// flag is the flag of the phase at index i as a run sees it after that
// phase: set only when the phase applied and sets it.
func (g *generated) flag(i int) bool { return g.phases[i].applies && g.phases[i].sets }

// String describes the workflow in one line, for the subtest's name:
// L,F(rec,when),F(rep,ser),L:resp/hook+completer.
func (g *generated) String() string {
	var shape []string
	for i, p := range g.phases {
		s, opts := "L", []string{}
		if p.foreign != "" {
			s = "F"
			opts = append(opts, p.foreign)
		}
		if p.when != nil {
			opts = append(opts, "when")
		}
		switch p.isolation {
		case pgx.ReadCommitted:
			opts = append(opts, "rc")
		case pgx.RepeatableRead:
			opts = append(opts, "rr")
		case pgx.Serializable:
			opts = append(opts, "ser")
		}
		if len(opts) > 0 {
			s += "(" + strings.Join(opts, ",") + ")"
		}
		if i == len(g.phases)-1 {
			s += ":resp"
		}
		shape = append(shape, s)
	}
	how := "nohook"
	if g.wrapper {
		how = "hook"
	}
	if g.completer {
		how += "+completer"
	}
	return strings.Join(shape, ",") + "/" + how
}

// route returns the route the seed asks for, or the direct one when this
// machine lacks the program it needs and the environment does not require
// it: the workflow stays the seed's either way.
func (g *generated) route() pgtest.Route {
	routes := map[string]pgtest.Route{}
	for _, r := range pgtest.Routes() {
		routes[r.Name] = r
	}
	var missing error
	switch {
	case pgtest.OnCitus():
		// Every route is the Citus cluster already, and the bouncer fronts
		// a single Postgres.
		return routes["direct"]
	case g.routeName == "pgbouncer":
		missing = pgcluster.BouncerInstalled()
	case g.routeName == "citus":
		missing = pgcluster.CitusInstalled()
	}
	if missing != nil && !testenv.Required(g.routeName) {
		return routes["direct"]
	}
	return routes[g.routeName]
}

// genReq is the request of every generated workflow.
type genReq struct {
	Item string `json:"item"`
}

// genState is what the phases of a generated workflow pass on: the flags
// their When predicates read, the phases that ran and the calls' outputs,
// which the last phase answers with.
type genState struct {
	Flags   map[string]bool   `json:"flags,omitempty"`
	Applied []string          `json:"applied,omitempty"`
	Outputs map[string]string `json:"outputs,omitempty"`
}

// genSchema holds one row per committed phase: a local phase's own
// transaction, or a foreign phase's record of its call. No unique
// constraint: a second commit of a phase must be counted, not refused.
const genSchema = `
CREATE TABLE gen_commits (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key_id  uuid NOT NULL,
    phase   text NOT NULL,
    attempt int NOT NULL,
    output  text
)`

// callLog is the downstream service of one foreign phase. It honours
// nothing and counts everything: every call it is sent, with its
// downstream key and the run it came from, and every reconciliation.
type callLog struct {
	phase string
	mu    sync.Mutex
	calls map[uuid.UUID][]providerCall // by key id
	asked map[uuid.UUID][]providerCall // reconciliations, by key id
}

// providerCall is one call or reconciliation as the provider saw it.
type providerCall struct {
	downstream string
	attempt    int
	resumed    bool
}

func newCallLog(phase string) *callLog {
	return &callLog{phase: phase, calls: map[uuid.UUID][]providerCall{}, asked: map[uuid.UUID][]providerCall{}}
}

// output is what the provider answers for a call: the same for every key,
// so that recovered responses equal the crash-free one.
func (p *callLog) output() string { return "ok:" + p.phase }

func (p *callLog) call(in *phase.Input[genReq, genState]) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[in.ID] = append(p.calls[in.ID], providerCall{in.DownstreamKey(), in.Attempt, in.Resumed})
	return p.output()
}

// reconcile answers whether the call of in's downstream key was sent.
func (p *callLog) reconcile(in *phase.Input[genReq, genState]) (string, phase.Verdict) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked[in.ID] = append(p.asked[in.ID], providerCall{in.DownstreamKey(), in.Attempt, in.Resumed})
	if p.sent(in.ID) {
		return p.output(), phase.Happened
	}
	return "", phase.NotHappened
}

// sent reports whether a call was sent for the key id; p.mu is held.
func (p *callLog) sent(id uuid.UUID) bool { return len(p.calls[id]) > 0 }

// log returns the calls and reconciliations of the key id.
func (p *callLog) log(id uuid.UUID) (calls, asked []providerCall) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]providerCall(nil), p.calls[id]...), append([]providerCall(nil), p.asked[id]...)
}

// operator stands for the person who resolves a key held because the
// outcome of a call that is not safe to repeat is unknown: a RunWrapper
// that, when a run ends with the key so held, records the hold, looks the
// call up at the provider, resolves the key with Client.Resolve (which
// finishes it) and answers the run with the key's response. It keeps
// phasetest's scenarios converging, as production would once the operator
// acts, and lets the check tell holds the documentation allows from holds
// a lost record causes.
type operator struct {
	phase.HookDefaults
	client    *phase.Client
	providers map[string]*callLog
	mu        sync.Mutex
	holds     map[uuid.UUID]map[string]int // by key id and phase
}

// operatorKey marks the context of the operator's own runs.
type operatorKey struct{}

// noFaults overrides the injector of a scenario's run for the operator's.
var noFaults = phase.InjectorFunc(func(context.Context, phase.Point) error { return nil })

func (o *operator) WrapRun(ctx context.Context, run *phase.RunInfo, next func(context.Context) (*phase.Outcome, error)) (*phase.Outcome, error) {
	out, err := next(ctx)
	held := errors.Is(err, phase.ErrOutcomeUnknown) || err == nil && out.Kind == phase.OutcomeOnHold
	if !held || ctx.Value(operatorKey{}) != nil {
		return out, err
	}
	// The operator works from another process: no fault of the scenario
	// reaches its run.
	octx := context.WithValue(phase.WithInjector(context.WithoutCancel(ctx), noFaults), operatorKey{}, true)
	row, ierr := o.client.Inspect(octx, run.Tenant, run.Key)
	if ierr != nil || row.Hold != keyrow.HoldUnknown {
		return out, err
	}
	p := o.providers[row.CallPending]
	if p == nil {
		return out, fmt.Errorf("operator: key %s held with no call of a foreign phase pending (%q): %w", run.Key, row.CallPending, err)
	}
	o.mu.Lock()
	if o.holds[row.ID] == nil {
		o.holds[row.ID] = map[string]int{}
	}
	o.holds[row.ID][row.CallPending]++
	o.mu.Unlock()
	res := keyrow.Resolution{RecoveryPoint: row.RecoveryPoint}
	p.mu.Lock()
	if p.sent(row.ID) {
		res.Happened, res.Output = true, []byte(strconv.Quote(p.output()))
	}
	p.mu.Unlock()
	row, rerr := o.client.Resolve(octx, run.Tenant, run.Key, res)
	if rerr != nil {
		return out, fmt.Errorf("operator: resolve %s: %w (after %w)", run.Key, rerr, err)
	}
	if row.FinishedAt == nil || row.ResponseStatus == nil {
		return out, fmt.Errorf("operator: key %s unfinished after its resolution (recovery point %s, hold %q, last error %q): %w",
			run.Key, row.RecoveryPoint, row.Hold, row.LastError, err)
	}
	return &phase.Outcome{Kind: phase.OutcomeResumed,
		Response: &keyrow.Response{Status: *row.ResponseStatus, Header: row.ResponseHeader, Body: row.ResponseBody}}, nil
}

// heldFor returns how many times the key id was held for phase.
func (o *operator) heldFor(id uuid.UUID, phase string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.holds[id][phase]
}

// runGenerated registers g's workflow with a client on db and runs both
// matrices over it, checking every converged scenario.
func runGenerated(t *testing.T, g *generated, db *pgxpool.Pool) {
	ctx := context.Background()
	if _, err := db.Exec(ctx, genSchema); err != nil {
		t.Fatal(err)
	}
	providers := map[string]*callLog{}
	var phases []phase.Phase[genReq, genState]
	for i := range g.phases {
		phases = append(phases, g.build(i, providers))
	}
	w, err := phase.NewWorkflow(fmt.Sprintf("generated_%d", g.seed), phases...)
	if err != nil {
		t.Fatalf("seed %d: %v", g.seed, err)
	}
	op := &operator{providers: providers, holds: map[uuid.UUID]map[string]int{}}
	cfg := &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError})),
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}
	if g.hasUnresolved() {
		cfg.Hooks = append(cfg.Hooks, op)
	}
	if g.wrapper {
		cfg.Hooks = append(cfg.Hooks, phaseWrapperFunc(func(ctx context.Context, _ *phase.PhaseInfo, next func(context.Context) error) error {
			return next(ctx)
		}))
	}
	c, err := phase.NewClient(db, cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	op.client = c
	check := &generativeCheck{g: g, db: db, client: c, providers: providers, operator: op}
	mcfg := phasetest.Config[genReq, genState]{
		Client: c, DB: db, Workflow: w, WithCompleter: g.completer,
		Request: func(string) genReq { return genReq{Item: "lamp"} },
		Check:   check.scenario,
	}
	t.Run("crashes", func(t *testing.T) { phasetest.CrashMatrix(t, mcfg) })
	t.Run("pairs", func(t *testing.T) { phasetest.PairMatrix(t, mcfg) })
}

func (g *generated) hasUnresolved() bool {
	for _, p := range g.phases {
		if p.foreign == unresolved {
			return true
		}
	}
	return false
}

// build declares the phase at index i, adding a foreign phase's provider
// to providers.
func (g *generated) build(i int, providers map[string]*callLog) phase.Phase[genReq, genState] {
	type input = phase.Input[genReq, genState]
	gp := g.phases[i]
	last := i == len(g.phases)-1
	// commit is the body of a local phase and the record of a foreign one:
	// it counts the commit in the phase's transaction and passes the flag
	// on; the last phase answers with the state.
	commit := func(ctx context.Context, tx pgx.Tx, in *input, output *string) (phase.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO gen_commits (key_id, phase, attempt, output) VALUES ($1, $2, $3, $4)`,
			in.ID, gp.name, in.Attempt, output); err != nil {
			return phase.Result{}, err
		}
		if in.State.Flags == nil {
			in.State.Flags = map[string]bool{}
		}
		in.State.Flags[gp.name] = gp.sets
		in.State.Applied = append(in.State.Applied, gp.name)
		if output != nil {
			if in.State.Outputs == nil {
				in.State.Outputs = map[string]string{}
			}
			in.State.Outputs[gp.name] = *output
		}
		if last {
			return phase.JSON(http.StatusCreated, in.State), nil
		}
		return phase.Next(), nil
	}
	var p phase.Phase[genReq, genState]
	if gp.foreign == "" {
		p = phase.Local(gp.name, func(ctx context.Context, tx pgx.Tx, in *input) (phase.Result, error) {
			return commit(ctx, tx, in, nil)
		})
	} else {
		prov := newCallLog(gp.name)
		providers[gp.name] = prov
		record := func(ctx context.Context, tx pgx.Tx, in *input, out string) (phase.Result, error) {
			return commit(ctx, tx, in, &out)
		}
		p = phase.Foreign(gp.name, func(_ context.Context, in *input) (string, error) { return prov.call(in), nil }, record)
		switch gp.foreign {
		case repeatable:
			p = p.Repeatable()
		case reconciled:
			p = phase.Reconciled(p, func(_ context.Context, in *input) (string, phase.Verdict, error) {
				out, res := prov.reconcile(in)
				return out, res, nil
			}, record)
		}
	}
	if gp.when != nil {
		on, want := g.phases[gp.when.on].name, gp.when.want
		p = p.When(func(in *input) bool { return in.State.Flags[on] == want })
	}
	if gp.isolation != "" {
		p = p.Isolation(gp.isolation)
	}
	return p
}

// generativeCheck checks the promises for each converged scenario of one
// generated workflow.
type generativeCheck struct {
	g         *generated
	db        *pgxpool.Pool
	client    *phase.Client
	providers map[string]*callLog
	operator  *operator
}

// genScenario is what a scenario did to its key, as the check needs it.
type genScenario struct {
	name string
	// kind is one of:
	//   - "crash-free": no fault (also a duplicate refused while the first
	//     run went on);
	//   - "crash": the run crashed at at and was recovered;
	//   - "takeover": the first run stalled at at past its lease, another
	//     took the key over, and the first then woke up.
	kind string
	at   phase.Point
}

// parseScenario reads what a scenario did from its name, as phasetest
// names them: ".../crashes/<phase>/<stage>/<recovery>" for CrashMatrix,
// ".../pairs/<first>@<phase>.<stage>/<what>[@<phase>.<stage>]" for
// PairMatrix, "crash-free" for the matrices' first run.
func parseScenario(name string) (genScenario, error) {
	s := genScenario{name: name, kind: "crash-free"}
	if name == "crash-free" {
		return s, nil
	}
	if i := strings.LastIndex(name, "/crashes/"); i >= 0 {
		parts := strings.Split(name[i+len("/crashes/"):], "/")
		if len(parts) != 3 {
			return s, fmt.Errorf("crash scenario %q: want <phase>/<stage>/<recovery>", name)
		}
		s.kind, s.at = "crash", phase.Point{Phase: parts[0], Stage: phase.Stage(parts[1])}
		return s, nil
	}
	i := strings.LastIndex(name, "/pairs/")
	if i < 0 {
		return s, fmt.Errorf("scenario %q is neither a crash nor a pair", name)
	}
	first, what, ok := strings.Cut(name[i+len("/pairs/"):], "/")
	_, point, ok2 := strings.Cut(first, "@")
	ph, stage, ok3 := strings.Cut(point, ".")
	if !ok || !ok2 || !ok3 {
		return s, fmt.Errorf("pair scenario %q: want <first>@<phase>.<stage>/<what>", name)
	}
	s.at = phase.Point{Phase: ph, Stage: phase.Stage(stage)}
	switch {
	case strings.HasPrefix(what, "duplicate-then-crash"):
		s.kind = "crash"
	case strings.HasPrefix(what, "duplicate-then-continue"):
		s.kind = "crash-free"
	case strings.Contains(what, "-takes-over"):
		s.kind = "takeover"
	default:
		return s, fmt.Errorf("pair scenario %q: unknown kind %q", name, what)
	}
	return s, nil
}

// bounds is how many times something may happen: from min to max.
type bounds struct{ min, max int }

func (b bounds) holds(n int) bool { return b.min <= n && n <= b.max }

func (b bounds) String() string {
	if b.min == b.max {
		return strconv.Itoa(b.min)
	}
	return fmt.Sprintf("%d to %d", b.min, b.max)
}

// The stages of a foreign phase between its call and its commit: a crash
// there leaves the call's outcome unrecorded.
func unrecorded(s phase.Stage) bool {
	return s == phase.AfterCall || s == phase.BeforeTx || s == phase.BeforeCommit
}

// foreignRule returns how many times the call of the foreign phase at index
// i may be sent, and how many times its outcome may be found unknown (a
// reconciliation, or a hold for an operator), in scenario s, with why.
//
// Crash scenarios (and a duplicate refused before a crash) apply the
// strict rule: a call is sent again only if no record of it committed.
// So a crash at a point of an earlier phase, of a later one, or of the
// phase itself after its record committed, leaves exactly one call and no
// unknown outcome: in particular a crash at any point of a later phase
// (its before_tx included) comes after the phase's record, which must be
// durable by then. Only a crash between the call and the record leaves the
// outcome unknown: a Repeatable call is then sent once more (two sends of
// one downstream key), any other is looked up exactly once (reconciled,
// or held and resolved) and never sent again. A crash at in_call, with
// the call marked as possibly sent but not sent, is looked up once too.
//
// Takeover scenarios allow what a stalled run legitimately does: a first
// run stalled at the phase's before_call or in_call, or at the previous
// applicable phase's after_commit, stands for a call already on its way
// and sends it after the taker did (at most two sends), its record then
// fenced out; a first run stalled between the call and the record has
// the taker repeat a Repeatable call (two sends) or look up any other
// (once). A first run stalled anywhere else must cause neither a second
// send nor a lookup. In every scenario, exactly one outcome is recorded.
func (c *generativeCheck) foreignRule(i int, s genScenario) (sends, unknown bounds, why string) {
	p := c.g.phases[i]
	rep := p.foreign == repeatable
	once, none := bounds{1, 1}, bounds{0, 0}
	at := s.at
	here := at.Phase == p.name
	switch s.kind {
	case "crash":
		switch {
		case here && at.Stage == phase.InCall && !rep:
			return once, once, "a crash at its in_call, after the call was marked as possibly sent: looked up once, never sent again"
		case here && unrecorded(at.Stage) && rep:
			return bounds{2, 2}, none, "a crash after its call returned, before its record: a Repeatable call is sent once more"
		case here && unrecorded(at.Stage):
			return once, once, "a crash after its call returned, before its record: looked up once, never sent again"
		case c.index(at.Phase) > i:
			return once, none, fmt.Sprintf("a crash at %s, a point of a later phase, after its call returned: its record must have been durable", at)
		}
		return once, none, fmt.Sprintf("a crash at %s, where no call of it was under way unrecorded", at)
	case "takeover":
		prev := c.previous(i)
		switch {
		case here && (at.Stage == phase.BeforeCall || at.Stage == phase.InCall),
			prev >= 0 && at == phase.Point{Phase: c.g.phases[prev].name, Stage: phase.AfterCommit}:
			unknownMax := 1
			if rep {
				unknownMax = 0
			}
			return bounds{1, 2}, bounds{0, unknownMax}, fmt.Sprintf("the first run stalled at %s, its call on its way, and the taker ran the phase", at)
		case here && unrecorded(at.Stage) && rep:
			return bounds{2, 2}, none, fmt.Sprintf("the first run stalled at %s, its call unrecorded: the taker sends a Repeatable call once more", at)
		case here && unrecorded(at.Stage):
			return once, once, fmt.Sprintf("the first run stalled at %s, its call unrecorded: the taker looks it up once", at)
		case c.index(at.Phase) > i:
			return once, none, fmt.Sprintf("the first run stalled at %s, a point of a later phase, after its call returned: its record must have been durable", at)
		}
		return once, none, fmt.Sprintf("the first run stalled at %s, where no call of it was under way unrecorded", at)
	}
	return once, none, "no crash: one call, never looked up"
}

// index returns the index of the phase named name, or -1.
func (c *generativeCheck) index(name string) int {
	for i, p := range c.g.phases {
		if p.name == name {
			return i
		}
	}
	return -1
}

// previous returns the index of the applicable phase before the one at i,
// or -1.
func (c *generativeCheck) previous(i int) int {
	for j := i - 1; j >= 0; j-- {
		if c.g.phases[j].applies {
			return j
		}
	}
	return -1
}

// scenario is Config.Check: it checks the promises for the key of one
// converged scenario, reporting every violation with the seed, the
// scenario, the phase and the counts.
//
//   - (a) each foreign call is sent as foreignRule allows, always with one
//     downstream key, and looked up (reconciled or held) as it allows;
//   - (b) each applicable phase committed exactly once (a local phase's
//     transaction, a foreign phase's record), and no other phase did or
//     was called;
//   - (c) the key is finished with no call left marked as pending, no
//     lease held (every run has returned), and was held only for a phase
//     that is neither Repeatable nor Reconciled, as foreignRule allows.
func (c *generativeCheck) scenario(t testing.TB, s phasetest.Scenario) {
	t.Helper()
	ctx := context.Background()
	sc, err := parseScenario(s.Name)
	if err != nil {
		t.Fatalf("seed %d: %v", c.g.seed, err)
	}
	violation := func(phaseName, format string, args ...any) {
		t.Helper()
		t.Errorf("seed %d (%s), scenario %s, phase %s: %s", c.g.seed, c.g, sc.name, phaseName, fmt.Sprintf(format, args...))
	}
	row, err := c.client.Inspect(ctx, s.Tenant, s.Key)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case row.FinishedAt == nil:
		violation("-", "the key is unfinished (recovery point %s, hold %q)", row.RecoveryPoint, row.Hold)
	case row.CallPending != "":
		violation(row.CallPending, "the finished key still marks the phase's call as pending")
	}
	if row.LeaseLeft > 0 {
		violation("-", "the key's lease has %v left although every run has returned", row.LeaseLeft)
	}
	commits := map[string]int{}
	rows, err := c.db.Query(ctx, `SELECT phase, count(*) FROM gen_commits WHERE key_id = $1 GROUP BY phase`, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		commits[name] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i, p := range c.g.phases {
		var calls, asked []providerCall
		if prov := c.providers[p.name]; prov != nil {
			calls, asked = prov.log(s.ID)
		}
		held := c.operator.heldFor(s.ID, p.name)
		if !p.applies {
			if commits[p.name]+len(calls)+len(asked)+held > 0 {
				violation(p.name, "the phase does not apply (When), yet it committed %d times, was sent %d calls, reconciled %d times, held %d times",
					commits[p.name], len(calls), len(asked), held)
			}
			continue
		}
		if commits[p.name] != 1 {
			what := "committed"
			if p.foreign != "" {
				what = "recorded its call's outcome"
			}
			violation(p.name, "%s %d times, want once", what, commits[p.name])
		}
		if p.foreign == "" {
			continue
		}
		sends, unknown, why := c.foreignRule(i, sc)
		if !sends.holds(len(calls)) {
			violation(p.name, "its call was sent %d times (%s), want %s: %s", len(calls), describeCalls(calls), sends, why)
		}
		all := append(calls, asked...)
		for _, call := range all {
			if call.downstream != all[0].downstream {
				violation(p.name, "its call went out, or was looked up, under two downstream keys: %s", describeCalls(all))
				break
			}
		}
		looked := len(asked) + held
		switch {
		case p.foreign == repeatable && looked > 0, p.foreign == reconciled && held > 0, p.foreign == unresolved && len(asked) > 0:
			violation(p.name, "a %s call was reconciled %d times and held %d times", p.foreign, len(asked), held)
		case !unknown.holds(looked):
			violation(p.name, "its call's outcome was found unknown %d times (reconciled %d, held %d), want %s: %s",
				looked, len(asked), held, unknown, why)
		}
	}
}

// describeCalls lists calls for a message: the runs they came from.
func describeCalls(calls []providerCall) string {
	if len(calls) == 0 {
		return "none"
	}
	var s []string
	for _, c := range calls {
		run := "new"
		if c.resumed {
			run = "resumed"
		}
		s = append(s, fmt.Sprintf("attempt %d (%s)", c.attempt, run))
	}
	return calls[0].downstream + ": " + strings.Join(s, ", ")
}

// TestGenerativeRulesTellALostRecordFromAnUnrecordedCall pins the rules of
// foreignRule on a workflow of a Repeatable phase, a Reconciled one and a
// local one, for scenarios as phasetest names them: a check that allowed
// a second send after a later phase's crash would find nothing.
func TestGenerativeRulesTellALostRecordFromAnUnrecordedCall(t *testing.T) {
	t.Parallel()
	g := &generated{phases: []genPhase{
		{name: "p1", foreign: repeatable, applies: true},
		{name: "p2", foreign: reconciled, applies: true},
		{name: "p3", applies: true},
	}}
	c := &generativeCheck{g: g}
	const prefix = "TestX/seed=1/F(rep),F(rec),L:resp/nohook/direct"
	for _, tc := range []struct {
		scenario       string
		phase          int
		sends, unknown bounds
	}{
		{"crash-free", 0, bounds{1, 1}, bounds{0, 0}},
		{prefix + "/crashes/p1/after_call/retry", 0, bounds{2, 2}, bounds{0, 0}},
		{prefix + "/crashes/p2/before_tx/completer", 1, bounds{1, 1}, bounds{1, 1}},
		{prefix + "/crashes/p2/in_call/retry", 1, bounds{1, 1}, bounds{1, 1}},
		{prefix + "/crashes/p3/before_tx/retry", 1, bounds{1, 1}, bounds{0, 0}},
		{prefix + "/crashes/p2/before_call/retry", 0, bounds{1, 1}, bounds{0, 0}},
		{prefix + "/pairs/client@p3.before_tx/duplicate-then-crash", 1, bounds{1, 1}, bounds{0, 0}},
		{prefix + "/pairs/client@p3.before_tx/duplicate-then-continue", 1, bounds{1, 1}, bounds{0, 0}},
		{prefix + "/pairs/completer@p3.before_tx/retry-takes-over@p3.before_tx", 1, bounds{1, 1}, bounds{0, 0}},
		{prefix + "/pairs/client@p2.in_call/retry-takes-over", 1, bounds{1, 2}, bounds{0, 1}},
		{prefix + "/pairs/client@p1.after_commit/completer-takes-over@p2.before_call", 1, bounds{1, 2}, bounds{0, 1}},
		{prefix + "/pairs/client@p1.before_commit/retry-takes-over", 0, bounds{2, 2}, bounds{0, 0}},
		{prefix + "/pairs/client@p2.after_call/retry-takes-over", 1, bounds{1, 1}, bounds{1, 1}},
	} {
		s, err := parseScenario(tc.scenario)
		if err != nil {
			t.Fatal(err)
		}
		sends, unknown, why := c.foreignRule(tc.phase, s)
		if sends != tc.sends || unknown != tc.unknown {
			t.Errorf("%s, phase %s: sends %s and lookups %s (%s), want %s and %s",
				tc.scenario, g.phases[tc.phase].name, sends, unknown, why, tc.sends, tc.unknown)
		}
	}
	if _, err := parseScenario(prefix + "/pairs/client@p1.in_call/retry-joins"); err == nil {
		t.Error("a pair scenario of an unknown kind was parsed; the check would apply a rule made for another")
	}
}
