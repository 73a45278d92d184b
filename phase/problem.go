package phase

import "net/http"

// ProblemTypePrefix starts the type URI of every RFC 9457 problem Handler
// answers: the type of a problem with code c is ProblemTypePrefix + c.
const ProblemTypePrefix = "urn:atomicphase:problem:"

// The problem codes of Handler's answers that a client of the
// Idempotency-Key contract acts on. Handler writes exactly these, so a
// contract published from them (see package conformance) cannot drift from
// what the handler answers.
const (
	// ProblemMissingKey: 400, the request has no Idempotency-Key or an
	// empty one. Nothing was run; send the request again with a key.
	ProblemMissingKey = "missing-idempotency-key"
	// ProblemInvalidKey: 400, the key is malformed, too long, or sent more
	// than once. Nothing was run.
	ProblemInvalidKey = "invalid-idempotency-key"
	// ProblemKeyReused: the mismatch status (DefaultMismatchStatus unless
	// HTTPConfig.MismatchStatus says otherwise), the key was used with
	// another request, finished or still in flight. Nothing was run.
	ProblemKeyReused = "idempotency-key-reused"
	// ProblemInProgress: 409 with Retry-After, another request holds the
	// key. Retrying with the same key is safe.
	ProblemInProgress = "request-in-progress"
	// ProblemOnHold: 409 with Retry-After, the key waits for reconciliation
	// or an operator.
	ProblemOnHold = "request-on-hold"
	// ProblemStoreUnavailable: 503 with Retry-After, the key store is
	// unavailable. Retrying with the same key is safe.
	ProblemStoreUnavailable = "store-unavailable"
	// ProblemTimeout: 503 with Retry-After, the run hit its time limit.
	// Retrying with the same key resumes it.
	ProblemTimeout = "timeout"
	// ProblemShuttingDown: 503 with Retry-After, the server is stopping:
	// the request did not run, or was cut short with nothing of its
	// interrupted step kept. Retrying with the same key is safe.
	ProblemShuttingDown = "shutting-down"
	// ProblemOutcomeUnknown: 503 with Retry-After, a downstream service did
	// not confirm its operation; a retry with the same key completes it
	// exactly once.
	ProblemOutcomeUnknown = "outcome-unknown"
	// ProblemDefinitionUnavailable: 503 with Retry-After, the request started
	// under a definition of the workflow this server does not run.
	ProblemDefinitionUnavailable = "definition-unavailable"
)

// DefaultMismatchStatus answers a key reused with another request unless
// HTTPConfig.MismatchStatus says otherwise: 422, as the IETF draft says.
const DefaultMismatchStatus = http.StatusUnprocessableEntity
