package phase_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// An Observer sees every event of every key: here it counts them by kind,
// as a metrics hook would.
func ExampleObserverFunc() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	var (
		mu     sync.Mutex
		counts = map[keyrow.EventKind]int{}
	)
	count := phase.ObserverFunc(func(ctx context.Context, e keyrow.Event) {
		mu.Lock()
		defer mu.Unlock()
		counts[e.Kind]++
	})
	w := transfers()
	client, err := phase.NewClient(pool, &phase.Config{Hooks: []phase.Hook{count}}, w)
	if err != nil {
		log.Fatal(err)
	}
	for _, amount := range []int{500, 500, 700} { // a run, its retry, a mismatch
		if _, err := w.Run(ctx, client, "acme", "k1", Transfer{Amount: amount}); err != nil {
			log.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(counts) // fmt prints a map sorted by key
	// Output: map[finished:1 mismatch:1 new:1 phase_committed:1 replayed:1]
}
