package phasetest_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/recovery"
)

// provider is a fake provider that logs every call by downstream key, and
// acts once per key when it honours keys.
type provider struct {
	honoursKeys bool
	mu          sync.Mutex
	calls       map[string]int // by downstream key
}

func (p *provider) call(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[key]++
	return "id-" + key
}

// effects returns how many times the provider acted on key.
func (p *provider) effects(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.honoursKeys {
		return min(p.calls[key], 1)
	}
	return p.calls[key]
}

type order struct {
	Gift bool `json:"gift"`
}

type orderState struct {
	Gift bool `json:"gift"`
}

// TestPairMatrixPausesTakersOnlyWhereTheyCanBe runs the matrices over a
// checkout with each kind of foreign phase: a charge through a provider
// that honours keys (Repeatable), a receipt through one that does not,
// with a reconcile function, a gift note through one that does not, with
// none (it waits for an operator when its outcome is unknown), only for
// gift orders (When). A run that takes over a call not safe to repeat
// reconciles it, or leaves it on hold, and never passes its in_call or
// after_call: no scenario may pause it there.
func TestPairMatrixPausesTakersOnlyWhereTheyCanBe(t *testing.T) {
	t.Parallel()
	pool := phasetest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE checkout (key_id uuid NOT NULL, step text NOT NULL, ref text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	charges, receipts, gifts := &provider{honoursKeys: true, calls: map[string]int{}}, &provider{calls: map[string]int{}}, &provider{calls: map[string]int{}}
	type in = phase.Input[order, orderState]
	step := func(name string) func(ctx context.Context, tx pgx.Tx, r *in, ref string) (phase.Result, error) {
		return func(ctx context.Context, tx pgx.Tx, r *in, ref string) (phase.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO checkout VALUES ($1, $2, $3)`, r.ID, name, ref)
			return phase.Next(), err
		}
	}
	send := func(p *provider) func(ctx context.Context, r *in) (string, error) {
		return func(ctx context.Context, r *in) (string, error) { return p.call(r.DownstreamKey()), nil }
	}
	receipt := phase.Reconciled(phase.Foreign("receipt_sent", send(receipts), step("receipt_sent")),
		func(ctx context.Context, r *in) (string, phase.Verdict, error) {
			if receipts.effects(r.DownstreamKey()) > 0 {
				return "id-" + r.DownstreamKey(), phase.Happened, nil
			}
			return "", phase.NotHappened, nil
		}, step("receipt_sent"))
	w, err := phase.NewWorkflow("checkout",
		phase.Local("reserved", func(ctx context.Context, tx pgx.Tx, r *in) (phase.Result, error) {
			r.State.Gift = r.Req.Gift
			_, err := tx.Exec(ctx, `INSERT INTO checkout VALUES ($1, 'reserved', '')`, r.ID)
			return phase.Next(), err
		}),
		phase.Foreign("charged", send(charges), step("charged")).Repeatable(),
		receipt,
		phase.Foreign("gift_noted", send(gifts), step("gift_noted")).When(func(r *in) bool { return r.State.Gift }),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, r *in) (phase.Result, error) {
			return phase.JSON(http.StatusCreated, map[string]bool{"gift": r.State.Gift}), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError})),
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, gift := range []bool{false, true} {
		t.Run(fmt.Sprintf("gift=%v", gift), func(t *testing.T) {
			cfg := phasetest.Config[order, orderState]{
				Client: c, DB: pool, Workflow: w, WithCompleter: true,
				Request: func(string) order { return order{Gift: gift} },
				Check: func(t testing.TB, s phasetest.Scenario) {
					// The record of each call is committed once; the
					// charge acted once.
					rows, err := pool.Query(ctx, `SELECT step, count(*) FROM checkout WHERE key_id = $1 GROUP BY step`, s.ID)
					if err != nil {
						t.Fatal(err)
					}
					counts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
						Step  string
						Count int
					}])
					if err != nil {
						t.Fatal(err)
					}
					for _, c := range counts {
						if c.Count != 1 {
							t.Errorf("%s: step %s committed %d times", s.Name, c.Step, c.Count)
						}
					}
					if s.Hold == "" && len(counts) != 3+btoi(gift) {
						t.Errorf("%s: steps %v; want every step once", s.Name, counts)
					}
				},
			}
			phasetest.CrashMatrix(t, cfg)
			phasetest.PairMatrix(t, cfg)
		})
	}
	for key := range charges.calls {
		if n := charges.effects(key); n != 1 {
			t.Errorf("charge %s acted %d times", key, n)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
