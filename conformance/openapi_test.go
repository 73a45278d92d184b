package conformance_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/atomicphase/atomicphase/conformance"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// The fragment of every profile, merged into a minimal API description
// whose operation references its parameter and responses, is a valid
// OpenAPI 3.1 document for a real parser, and says what the profile checks.
func TestOpenAPIFragmentIsValidOpenAPI31(t *testing.T) {
	t.Parallel()
	for _, p := range conformance.Profiles() {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			var fragment map[string]any
			if err := json.Unmarshal(conformance.OpenAPI(p), &fragment); err != nil {
				t.Fatal(err)
			}
			responses := fragment["x-idempotency-responses"].(map[string]any)
			marker := cmp.Or(p.ReplayHeader, "Idempotency-Replayed")
			responses["201"] = map[string]any{"description": "Created", "headers": map[string]any{
				marker: map[string]any{"$ref": "#/components/headers/" + marker}}}
			spec := map[string]any{
				"openapi":    "3.1.0",
				"info":       map[string]any{"title": "orders", "version": "1"},
				"components": fragment["components"],
				"paths": map[string]any{"/orders": map[string]any{"post": map[string]any{
					"parameters": []any{map[string]any{"$ref": "#/components/parameters/IdempotencyKey"}},
					"responses":  responses,
				}}},
			}
			b, err := json.Marshal(spec)
			if err != nil {
				t.Fatal(err)
			}
			loader := openapi3.NewLoader()
			doc, err := loader.LoadFromData(b)
			if err != nil {
				t.Fatal(err)
			}
			if err := doc.Validate(loader.Context); err != nil {
				t.Fatalf("not valid OpenAPI 3.1: %v", err)
			}
			op := doc.Paths.Find("/orders").Post
			if name := op.Parameters[0].Value.Name; name != keyrow.HeaderName {
				t.Errorf("the key parameter is %q", name)
			}
			for _, status := range []int{http.StatusBadRequest, cmp.Or(p.MismatchStatus, http.StatusUnprocessableEntity), http.StatusConflict, http.StatusServiceUnavailable} {
				if op.Responses.Status(status) == nil {
					t.Errorf("no %d response", status)
				}
			}
			if h := op.Responses.Status(http.StatusConflict).Value.Headers["Retry-After"]; h == nil {
				t.Error("the 409 has no Retry-After")
			}
			markers := []string{p.ReplayHeader}
			if p.ReplayHeader == "" {
				markers = []string{"Idempotent-Replayed", "Idempotency-Replayed"}
			}
			for _, m := range markers {
				if doc.Components.Headers[m] == nil {
					t.Errorf("no %s header", m)
				}
			}
			if p.Name == "atomicphase" {
				reused := op.Responses.Status(phase.DefaultMismatchStatus).Value.Content.Get("application/problem+json")
				if reused == nil || !bytes.Contains(mustJSON(t, reused.Schema), []byte(strconv.Quote(phase.ProblemTypePrefix+phase.ProblemKeyReused))) {
					t.Errorf("the reused key's problem type is not %s", phase.ProblemTypePrefix+phase.ProblemKeyReused)
				}
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// docs/conformance-openapi.json is the atomicphase profile's fragment as
// OpenAPI writes it today.
func TestPublishedFragmentIsTheHandlersContract(t *testing.T) {
	t.Parallel()
	published, err := os.ReadFile("../docs/conformance-openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(published, conformance.OpenAPI(conformance.AtomicPhase())) {
		t.Error("docs/conformance-openapi.json differs from conformance.OpenAPI(conformance.AtomicPhase()); write it again from the function")
	}
}
