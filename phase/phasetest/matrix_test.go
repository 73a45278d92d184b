package phasetest_test

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/recovery"
)

// note is the request of a one-phase workflow that inserts a note per key
// and answers with its generated id.
type note struct {
	Text string `json:"text"`
}

const notesSchema = `CREATE TABLE notes (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key_id uuid NOT NULL UNIQUE, text text NOT NULL)`

// notesConfig returns a matrix config for the notes workflow on pool. When
// tellResumed is set, the answer says whether the run resumed the key: a
// bug, since the crash-free answer and a recovered one then differ.
func notesConfig(t *testing.T, pool *pgxpool.Pool, tellResumed bool, completer recovery.CompleterConfig) phasetest.Config[note, struct{}] {
	t.Helper()
	w, err := phase.NewWorkflow("notes", phase.Local("noted", func(ctx context.Context, tx pgx.Tx, in *phase.Input[note, struct{}]) (phase.Result, error) {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO notes (key_id, text) VALUES ($1, $2) RETURNING id`, in.ID, in.Req.Text).Scan(&id); err != nil {
			return phase.Result{}, err
		}
		body := map[string]any{"note_id": id, "text": in.Req.Text}
		if tellResumed {
			body["resumed"] = in.Resumed
		}
		return phase.JSON(http.StatusCreated, body), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), Completer: completer}, w)
	if err != nil {
		t.Fatal(err)
	}
	return phasetest.Config[note, struct{}]{
		Client: c, DB: pool, Workflow: w, WithCompleter: true,
		Request: func(string) note { return note{Text: "hello"} },
		Compare: phasetest.IgnoreFields("note_id"),
		Check: func(t testing.TB, s phasetest.Scenario) {
			var notes int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM notes WHERE key_id = $1`, s.ID).Scan(&notes); err != nil || notes != 1 {
				t.Fatalf("%s: %d notes (%v), want 1", s.Name, notes, err)
			}
		},
	}
}

func newNotesPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := phasetest.Pool(t)
	if _, err := pool.Exec(context.Background(), notesSchema); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestMatricesRunTwiceOnOneDatabase: two tests, or -count=2, against one
// database that is not dropped in between.
func TestMatricesRunTwiceOnOneDatabase(t *testing.T) {
	t.Parallel()
	pool := newNotesPool(t)
	cfg := notesConfig(t, pool, false, recovery.CompleterConfig{StuckAfter: -1, Backoff: -1})
	for _, run := range []string{"first", "second"} {
		t.Run(run, func(t *testing.T) {
			phasetest.CrashMatrix(t, cfg)
			phasetest.PairMatrix(t, cfg)
		})
	}
	var notes, keys int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM notes), (SELECT count(*) FROM idempotency_keys)`).Scan(&notes, &keys); err != nil {
		t.Fatal(err)
	}
	if notes != keys || keys < 2*20 {
		t.Fatalf("%d notes for %d keys after two runs, want one per key and at least 40", notes, keys)
	}
}

// TestMatrixFailuresSayWhatWentWrong runs matrices that must fail, in a
// child test binary (a failing subtest fails its parent), and checks that
// each failure names its cause.
func TestMatrixFailuresSayWhatWentWrong(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFailingMatrices$", "-test.v")
	// The child creates its databases on this binary's server rather than
	// starting one of its own.
	cmd.Env = append(os.Environ(), "PHASETEST_FAILING=1", phasetest.EnvDSN+"="+pgtest.Server(t).AdminDSN)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the failing matrices passed:\n%s", out)
	}
	for _, want := range []string{
		// A recovered answer that differs names the field.
		"the recovered response differs from the crash-free one: body field resumed: crash-free false, recovered true",
		// WithCompleter on a client whose completer waits for idle keys.
		"because the key has not been idle for the completer's StuckAfter: for WithCompleter, build the client with Config.Completer.StuckAfter = -1",
		// A key used twice: replayed, not "without a response".
		`crash-free run of key "used-twice": the key was already finished: the run replayed its stored response`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the output does not say %q:\n%s", want, out)
		}
	}
}

// TestFailingMatrices is run by TestMatrixFailuresSayWhatWentWrong.
func TestFailingMatrices(t *testing.T) {
	if os.Getenv("PHASETEST_FAILING") == "" {
		t.Skip("run by TestMatrixFailuresSayWhatWentWrong")
	}
	t.Run("an answer that says it resumed", func(t *testing.T) {
		cfg := notesConfig(t, newNotesPool(t), true, recovery.CompleterConfig{StuckAfter: -1})
		cfg.WithCompleter = false
		phasetest.CrashMatrix(t, cfg)
	})
	t.Run("a completer that waits a minute", func(t *testing.T) {
		phasetest.CrashMatrix(t, notesConfig(t, newNotesPool(t), false, recovery.CompleterConfig{}))
	})
	t.Run("a key used twice", func(t *testing.T) {
		cfg := notesConfig(t, newNotesPool(t), false, recovery.CompleterConfig{})
		phasetest.Points(t, cfg, "used-twice")
		phasetest.Points(t, cfg, "used-twice")
	})
}
