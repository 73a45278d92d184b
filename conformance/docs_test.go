package conformance_test

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/conformance"
)

// charges is the endpoint docs/conformance.md checks: one written without
// this library.
var charges http.Handler = newLeaseEndpoint()

func TestChargesEndpoint(t *testing.T) {
	t.Parallel()
	conformance.Test(t, conformance.Config{
		Handler: charges, // or URL: "https://staging.example.com/v1/charges"
		URL:     "/v1/charges",
		Header:  http.Header{"Authorization": {"Bearer test"}, "Content-Type": {"application/json"}},
		Body:    []byte(`{"amount": 2000, "currency": "usd"}`),
	})
}

// The Go example of docs/conformance.md is TestChargesEndpoint, which
// runs with this package's tests.
func TestTheGuidesExampleIsATestThatRuns(t *testing.T) {
	t.Parallel()
	guide, err := os.ReadFile("../docs/conformance.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("docs_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(guide), "```go\n")
	block, _, closed := strings.Cut(rest, "```\n")
	if !ok || !closed || !strings.Contains(string(self), block) {
		t.Errorf("the Go block of docs/conformance.md is not TestChargesEndpoint of docs_test.go:\n%s", block)
	}
}
