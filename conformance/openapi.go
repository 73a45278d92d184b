package conformance

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strconv"

	"github.com/atomicphase/atomicphase/keyrow"
)

// OpenAPI returns the Idempotency-Key contract that p checks as an OpenAPI
// 3.1 fragment, in JSON (which YAML tools read too), for a team to merge
// into its API's description: under components, the Idempotency-Key
// parameter, the replay marker and Retry-After headers, the Problem schema
// (RFC 9457) and the responses to a refused key (400), a reused key (the
// profile's mismatch status), a key in flight (409) and an outage (503).
// The root's x-idempotency-responses maps each status to its response, to
// copy into every operation that takes a key. A profile that accepts
// either replay marker (Generic) declares both; one that accepts 400, 409
// or 422 for a reused key maps 422 to it, as the IETF draft does. It is made from the same
// values the scenarios judge by, and AtomicPhase's from the constants
// phase.Handler writes, so the published contract and the checked one
// cannot drift.
func OpenAPI(p Profile) []byte {
	mismatch := p.MismatchStatus
	if mismatch == 0 {
		mismatch = http.StatusUnprocessableEntity
	}
	markers := map[string]any{}
	for _, name := range p.markers() {
		markers[name] = map[string]any{
			"description": "Present with the value true when the response is the stored answer to an earlier request with the same Idempotency-Key.",
			"schema":      map[string]any{"type": "string", "enum": []string{"true"}},
		}
	}
	headers := map[string]any{
		"Retry-After": map[string]any{
			"description": "Seconds to wait before retrying with the same Idempotency-Key.",
			"schema":      map[string]any{"type": "integer", "minimum": 0},
		},
	}
	maps.Copy(headers, markers)
	retryAfter := map[string]any{"$ref": "#/components/headers/Retry-After"}
	problem := func(desc string, types []string, headers map[string]any) map[string]any {
		schema := map[string]any{"$ref": "#/components/schemas/Problem"}
		if len(types) > 0 {
			schema = map[string]any{"allOf": []any{schema, map[string]any{
				"properties": map[string]any{"type": map[string]any{"enum": types}}}}}
		}
		mediaType := "application/problem+json"
		if !p.Problems {
			mediaType = "application/json"
		}
		r := map[string]any{"description": desc, "content": map[string]any{mediaType: map[string]any{"schema": schema}}}
		if headers != nil {
			r["headers"] = headers
		}
		return r
	}
	nonEmpty := func(s ...string) []string {
		var out []string
		for _, v := range s {
			if v != "" {
				out = append(out, v)
			}
		}
		return out
	}
	fragment := map[string]any{
		"x-idempotency-responses": map[string]any{
			strconv.Itoa(http.StatusBadRequest):         map[string]any{"$ref": "#/components/responses/IdempotencyKeyInvalid"},
			strconv.Itoa(mismatch):                      map[string]any{"$ref": "#/components/responses/IdempotencyKeyReused"},
			strconv.Itoa(http.StatusConflict):           map[string]any{"$ref": "#/components/responses/IdempotencyKeyInFlight"},
			strconv.Itoa(http.StatusServiceUnavailable): map[string]any{"$ref": "#/components/responses/ServiceUnavailable"},
		},
		"components": map[string]any{
			"parameters": map[string]any{
				"IdempotencyKey": map[string]any{
					"name": keyrow.HeaderName, "in": "header", "required": true,
					"description": fmt.Sprintf("A key the client makes unique per operation (a UUID), sent bare or as an RFC 8941 sf-string, 1 to %d characters. A retry with the same key and request gets the first answer, marked %s: true; the key with another request is refused.", keyrow.MaxKeyLength, p.marker()),
					"schema":      map[string]any{"type": "string", "minLength": 1, "maxLength": keyrow.MaxKeyLength + 2},
				},
			},
			"headers": headers,
			"schemas": map[string]any{
				"Problem": map[string]any{
					"type":        "object",
					"description": "RFC 9457 problem details.",
					"properties": map[string]any{
						"type":   map[string]any{"type": "string", "format": "uri-reference"},
						"title":  map[string]any{"type": "string"},
						"status": map[string]any{"type": "integer"},
						"detail": map[string]any{"type": "string"},
					},
				},
			},
			"responses": map[string]any{
				"IdempotencyKeyInvalid": problem(
					"400: the Idempotency-Key is missing, empty, sent more than once, too long or malformed. Nothing was executed; send the request with one valid key.",
					nonEmpty(p.ProblemTypes.MissingKey, p.ProblemTypes.InvalidKey), nil),
				"IdempotencyKeyReused": problem(
					fmt.Sprintf("%s: the Idempotency-Key was used with another request. Nothing was executed; use a new key for a new request.", statuses(p.mismatch())),
					nonEmpty(p.ProblemTypes.KeyReused), nil),
				"IdempotencyKeyInFlight": problem(
					"409: another request with this Idempotency-Key is still being processed. Retry with the same key after Retry-After.",
					nonEmpty(p.ProblemTypes.InProgress), map[string]any{"Retry-After": retryAfter}),
				"ServiceUnavailable": problem(
					"503: the request could not be completed now. Retrying with the same Idempotency-Key after Retry-After is safe.",
					nil, map[string]any{"Retry-After": retryAfter}),
			},
		},
	}
	b, err := json.MarshalIndent(fragment, "", "  ")
	if err != nil {
		panic(err) // maps of strings, numbers and slices always encode
	}
	return append(b, '\n')
}
