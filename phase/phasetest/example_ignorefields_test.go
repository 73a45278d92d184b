package phasetest_test

import (
	"fmt"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

// A crash matrix compares each scenario's response with an uncrashed
// run's. A field that differs between keys by design, such as a generated
// id, is left out of the comparison with IgnoreFields.
func ExampleIgnoreFields() {
	want := &keyrow.Response{Status: 201, Body: []byte(`{"order_id": 1, "item": "lamp"}`)}
	got := &keyrow.Response{Status: 201, Body: []byte(`{"order_id": 7, "item": "lamp"}`)}
	wrong := &keyrow.Response{Status: 201, Body: []byte(`{"order_id": 7, "item": "vase"}`)}

	compare := phasetest.IgnoreFields("order_id")
	fmt.Println(compare(want, got))
	fmt.Println(compare(want, wrong))
	// Output:
	// <nil>
	// body field item: crash-free "lamp", recovered "vase"
}
