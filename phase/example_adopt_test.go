package phase_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/atomicphase/atomicphase/phase"
)

// A deploy renames a phase and adds one. The keys the old code left
// unfinished resume on the new code.
func ExampleWorkflow_Adopt() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	type Signup struct{ Email string }
	type State struct{ Ran []string }
	type run = phase.Input[Signup, State]
	step := func(name string) phase.Phase[Signup, State] {
		return phase.Local(name, func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
			in.State.Ran = append(in.State.Ran, name)
			return phase.Next(), nil
		})
	}
	done201 := phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *run) (phase.Result, error) {
		return phase.JSON(http.StatusCreated, in.State.Ran), nil
	})
	before, _ := phase.NewWorkflow("signups", step("account_created"), step("mailed"), done201)

	// A rename alone keeps the definition: Formerly keeps the old identity.
	renamed, _ := phase.NewWorkflow("signups", step("account_created"), step("welcome_sent").Formerly("mailed"), done201)
	fmt.Println(renamed.Definition() == before.Definition())

	// Adding a phase makes a new definition, which adopts the old one.
	after, err := phase.NewWorkflow("signups",
		step("account_created"), step("email_checked"), step("welcome_sent").Formerly("mailed"), done201)
	if err != nil {
		log.Fatal(err)
	}
	if err := after.Adopt("signups", before.Definition(), nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println(after.Phases()) // recovery points: welcome_sent keeps "mailed"

	// The old code crashes after its first phase, and the new code resumes.
	old, err := phase.NewClient(pool, &phase.Config{Logger: quiet}, before)
	if err != nil {
		log.Fatal(err)
	}
	crash := phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "account_created", Stage: phase.AfterCommit}))
	if _, err := before.Run(crash, old, "acme", "k1", Signup{Email: "ada@example.com"}); err == nil {
		log.Fatal("no crash")
	}
	if _, err := old.Unlock(ctx, "acme", "k1"); err != nil { // the old process is gone
		log.Fatal(err)
	}
	upgraded, err := phase.NewClient(pool, &phase.Config{Logger: quiet}, after)
	if err != nil {
		log.Fatal(err)
	}
	out, err := after.Run(ctx, upgraded, "acme", "k1", Signup{Email: "ada@example.com"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(out.Kind, " ", string(out.Response.Body))
	// Output:
	// true
	// [account_created email_checked mailed answered]
	// resumed ["account_created","email_checked","welcome_sent"]
}
