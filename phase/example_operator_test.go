package phase_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

type Note struct{ To string }

// notes sends one message and answers with its id. Its first call's
// outcome is lost, and the provider offers no lookup: the key is held
// until an operator says what happened. sent counts the calls.
func notes(ctx context.Context, pool *pgxpool.Pool) (*phase.Client, *phase.Workflow[Note, struct{}], *int) {
	sent := 0
	type run = phase.Input[Note, struct{}]
	w, err := phase.NewWorkflow("notes", phase.Foreign("sent",
		func(ctx context.Context, in *run) (string, error) {
			sent++
			if sent == 1 {
				return "", phase.MaybeHappened(errors.New("connection reset"))
			}
			return fmt.Sprintf("msg_%d", sent), nil
		},
		func(ctx context.Context, tx pgx.Tx, in *run, id string) (phase.Result, error) {
			return phase.JSON(http.StatusOK, map[string]string{"message": id}), nil
		}))
	if err != nil {
		log.Fatal(err)
	}
	client, err := phase.NewClient(pool, &phase.Config{Logger: quiet}, w)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := w.Run(ctx, client, "acme", "k1", Note{To: "ada"}); !errors.Is(err, phase.ErrOutcomeUnknown) {
		log.Fatal(err)
	}
	return client, w, &sent
}

// The operator found the message in the provider's dashboard: the call
// happened, with this output. Resolve records it and finishes the key.
func ExampleClient_Resolve() {
	ctx := phase.WithActor(context.Background(), "alice")
	pool, done := exampleDB(ctx)
	defer done()
	client, _, sent := notes(ctx, pool)

	row, err := client.Inspect(ctx, "acme", "k1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(client.StatusOf(row), row.RecoveryPoint)
	// Seen is what the operator looked at: the resolution applies only
	// while the key is still as seen.
	row, err = client.Resolve(ctx, "acme", "k1", keyrow.Resolution{
		RecoveryPoint: row.RecoveryPoint,
		Happened:      true,
		Output:        json.RawMessage(`"msg_from_dashboard"`),
	}, row.Seen())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(client.StatusOf(row), *row.ResponseStatus, strings.TrimSpace(string(row.ResponseBody)), "calls:", *sent)
	// Output:
	// unknown started
	// finished 200 {"message":"msg_from_dashboard"} calls: 1
}

// The operator knows the message was never sent: Retry makes the key
// runnable, and the next run makes the call again, with the same
// downstream key.
func ExampleClient_Retry() {
	ctx := phase.WithActor(context.Background(), "alice")
	pool, done := exampleDB(ctx)
	defer done()
	client, w, sent := notes(ctx, pool)

	row, err := client.Inspect(ctx, "acme", "k1")
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Retry(ctx, "acme", "k1", row.Seen()); err != nil {
		log.Fatal(err)
	}
	out, err := w.Run(ctx, client, "acme", "k1", Note{To: "ada"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(out.Kind, strings.TrimSpace(string(out.Response.Body)), "calls:", *sent)
	// Output: resumed {"message":"msg_2"} calls: 2
}
