package phase_test

import (
	"context"
	"fmt"
	"log"

	"github.com/atomicphase/atomicphase/phase"
)

// A Recorder lists the fault points one run of a workflow reaches: the
// places a test crashes it with CrashAt, one at a time, as package
// phasetest's CrashMatrix does.
func ExampleRecorder() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	w := transfers()
	client, err := phase.NewClient(pool, nil, w)
	if err != nil {
		log.Fatal(err)
	}
	rec := &phase.Recorder{}
	if _, err := w.Run(phase.WithInjector(ctx, rec), client, "acme", "k1", Transfer{Amount: 500, Payout: "bank"}); err != nil {
		log.Fatal(err)
	}
	for _, p := range rec.Points() {
		fmt.Println(p)
	}
	// Output:
	// transfer_created/before_tx
	// transfer_created/before_commit
	// transfer_created/after_commit
	// payout_sent/before_call
	// payout_sent/in_call
	// payout_sent/after_call
	// payout_sent/before_tx
	// payout_sent/before_commit
	// payout_sent/after_commit
	// settled/before_tx
	// settled/before_commit
	// settled/after_commit
	// settled/before_response
}
