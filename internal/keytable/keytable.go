// Package keytable is the one table of idempotency keys that the tests of
// every transport read: HTTP headers, gRPC and Connect metadata, request
// fields. Each transport must store a run under the same key, or refuse
// the same values for the same reason.
package keytable

import (
	_ "embed"
	"encoding/json"
)

// Verdicts of a refused key.
const (
	Missing = "missing"
	Invalid = "invalid"
)

// Case is one input and what every transport makes of it.
type Case struct {
	Name string `json:"name"`
	// Values are every value of the carrier: header lines, metadata
	// entries; a request field carries at most one.
	Values []string `json:"values"`
	// Key is the key the run is stored under, when the values are
	// accepted.
	Key string `json:"key"`
	// Verdict is Missing or Invalid when they are refused.
	Verdict string `json:"verdict"`
}

//go:embed keys.json
var table []byte

// Cases returns the table.
func Cases() []Case {
	var t struct {
		Cases []Case `json:"cases"`
	}
	if err := json.Unmarshal(table, &t); err != nil {
		panic("keytable: keys.json: " + err.Error())
	}
	return t.Cases
}
