package keyrow_test

import (
	"fmt"

	"github.com/atomicphase/atomicphase/keyrow"
)

// A downstream key depends only on the tenant, the key, the request and
// the phase: every retry, in any process, sends the provider the same one,
// even after the key's row was lost. A run reads it as
// phase.Input.DownstreamKey.
func ExampleDownstreamKey() {
	fp, _ := keyrow.Fingerprint("transfers", []byte(`{"amount": 500}`))
	retry, _ := keyrow.Fingerprint("transfers", []byte(`{"amount":500}`))
	other, _ := keyrow.Fingerprint("transfers", []byte(`{"amount":700}`))

	key := keyrow.DownstreamKey("payments", "acme", "k1", fp[:], "payout_sent")
	fmt.Println(key)
	fmt.Println(key == keyrow.DownstreamKey("payments", "acme", "k1", retry[:], "payout_sent"))
	fmt.Println(key == keyrow.DownstreamKey("payments", "acme", "k1", other[:], "payout_sent"))
	fmt.Println(key == keyrow.DownstreamKey("payments", "globex", "k1", fp[:], "payout_sent"))
	// Output:
	// payments-d9bbd6619b9313d2be4983b40de4a90d-payout_sent
	// true
	// false
	// false
}
