package phase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/atomicphase/atomicphase/keyrow"
)

// DefaultMaxBodyBytes is the largest request body Handler reads by default.
const DefaultMaxBodyBytes = 1 << 20

// ReplayedHeader is set to "true" on responses replayed from a stored key, as
// Stripe does.
const ReplayedHeader = "Idempotent-Replayed"

// RequestError is an error a Tenant or Decode function returns to answer the
// client with a specific status and a message a client developer can act on.
// Field names the offending request field, when there is one.
type RequestError struct {
	Status int
	Detail string
	Field  string
}

func (e *RequestError) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Detail
	}
	return e.Detail
}

// Invalid returns a 422 RequestError for a request field that failed
// validation.
func Invalid(field, detail string) *RequestError {
	return &RequestError{Status: http.StatusUnprocessableEntity, Field: field, Detail: detail}
}

// HTTPConfig configures Workflow.Handler. Zero values mean the documented
// default.
type HTTPConfig[Req any] struct {
	// Tenant returns whose key the request uses, from the request's
	// authentication, never its body. Required. An error answers 401 with its
	// message, or the status of a *RequestError.
	Tenant func(r *http.Request) (string, error)
	// Decode reads the request (body limited to MaxBodyBytes) into Req
	// (default: DecodeJSON). An error answers 400 with its message, or the
	// status of a *RequestError (see Invalid). Requests that fail to decode
	// are not stored.
	Decode func(r *http.Request) (Req, error)
	// MaxBodyBytes limits the request body (default DefaultMaxBodyBytes);
	// a larger body answers 413.
	MaxBodyBytes int64
	// MismatchStatus answers a key reused with another request: 422 by
	// default, as the IETF draft says; Stripe-style APIs use 400.
	MismatchStatus int
}

// DecodeJSON decodes a JSON request body into Req, refusing unknown fields
// and trailing data.
func DecodeJSON[Req any](r *http.Request) (Req, error) {
	var req Req
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("request body is not valid JSON for this endpoint: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, errors.New("request body has data after the JSON value")
	}
	return req, nil
}

// Handler returns an http.Handler that runs w for each request under the
// Idempotency-Key header. It parses the key (bare or RFC 8941 quoted), finds
// the tenant and decodes the request with cfg's functions, and answers:
// the stored response (replays carry Idempotent-Replayed: true and identical
// bytes); 400 for a missing or malformed key; 409 with Retry-After while
// another request holds the key; the mismatch status when the key was used
// with another request; 413 for an oversized body; and for failures an
// application/problem+json body (RFC 9457) that says whether retrying with
// the same key is safe. Failures are never stored: the next retry resumes.
func (w *Workflow[Req, State]) Handler(rn *Runner, cfg HTTPConfig[Req]) (http.Handler, error) {
	if cfg.Tenant == nil {
		return nil, errors.New("phase: HTTPConfig.Tenant is required")
	}
	if cfg.Decode == nil {
		cfg.Decode = DecodeJSON[Req]
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MismatchStatus == 0 {
		cfg.MismatchStatus = http.StatusUnprocessableEntity
	}
	return &handler[Req, State]{w: w, rn: rn, cfg: cfg}, nil
}

type handler[Req, State any] struct {
	w   *Workflow[Req, State]
	rn  *Runner
	cfg HTTPConfig[Req]
}

func (h *handler[Req, State]) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	values := r.Header.Values(keyrow.HeaderName)
	if len(values) > 1 {
		writeProblem(rw, http.StatusBadRequest, "invalid-idempotency-key", "Invalid Idempotency-Key",
			"the request has more than one Idempotency-Key header; send exactly one", 0)
		return
	}
	key, err := keyrow.ParseKey(r.Header.Get(keyrow.HeaderName))
	if err != nil {
		code := "invalid-idempotency-key"
		if errors.Is(err, keyrow.ErrKeyMissing) {
			code = "missing-idempotency-key"
		}
		writeProblem(rw, http.StatusBadRequest, code, "Invalid Idempotency-Key", err.Error(), 0)
		return
	}
	tenant, err := h.cfg.Tenant(r)
	if err != nil {
		writeRequestError(rw, err, http.StatusUnauthorized)
		return
	}
	r.Body = http.MaxBytesReader(rw, r.Body, h.cfg.MaxBodyBytes)
	req, err := h.cfg.Decode(r)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeProblem(rw, http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
				fmt.Sprintf("the request body is larger than %d bytes", tooBig.Limit), 0)
			return
		}
		writeRequestError(rw, err, http.StatusBadRequest)
		return
	}
	// Once the key is taken, the run goes on if the client hangs up: its
	// retry then finds a stored answer instead of a half-done key.
	out, err := h.w.Run(context.WithoutCancel(r.Context()), h.rn, tenant, key, req)
	if err != nil {
		h.writeError(rw, err)
		return
	}
	switch out.Kind {
	case keyrow.Replay:
		writeStored(rw, out.Response, true)
	case keyrow.New, keyrow.Resumed:
		writeStored(rw, out.Response, false)
	case keyrow.Held:
		writeProblem(rw, http.StatusConflict, "request-in-progress", "Request in progress",
			"another request with this Idempotency-Key is still being processed; retry after the time in Retry-After", out.RetryAfter)
	case keyrow.Parked:
		detail := "the outcome of this request is being reconciled with a downstream service; retry later with the same Idempotency-Key"
		if out.Hold == keyrow.HoldDead {
			detail = "processing of this request was abandoned after repeated failures; an operator must retry it"
		}
		writeProblem(rw, http.StatusConflict, "request-on-hold", "Request on hold", detail, out.RetryAfter)
	case keyrow.Mismatch:
		writeProblem(rw, h.cfg.MismatchStatus, "idempotency-key-reused", "Idempotency-Key reused",
			"this Idempotency-Key was already used with a different request; use a new key for a new request", 0)
	}
}

func (h *handler[Req, State]) writeError(rw http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrCrash):
		// Behave as a killed process would: the client gets no answer.
		panic(http.ErrAbortHandler)
	case errors.Is(err, ErrUnavailable):
		writeProblem(rw, http.StatusServiceUnavailable, "store-unavailable", "Service unavailable",
			"the request was not processed; retry with the same Idempotency-Key", 1)
	case errors.Is(err, keyrow.ErrLeaseLost):
		writeProblem(rw, http.StatusConflict, "request-in-progress", "Request in progress",
			"another request with this Idempotency-Key took over processing; retry with the same key", 1)
	case errors.Is(err, ErrOutcomeUnknown):
		writeProblem(rw, http.StatusServiceUnavailable, "outcome-unknown", "Downstream outcome unknown",
			"a downstream service did not confirm the operation; retry with the same Idempotency-Key and it will be completed exactly once", 1)
	default:
		writeProblem(rw, http.StatusInternalServerError, "internal-error", "Internal server error",
			"the request failed part-way and nothing was stored as its answer; retrying with the same Idempotency-Key resumes it safely", 0)
	}
}

func writeStored(rw http.ResponseWriter, resp *keyrow.Response, replayed bool) {
	hdr := rw.Header()
	for k, v := range resp.Header {
		hdr[k] = append([]string(nil), v...)
	}
	if replayed {
		hdr.Set(ReplayedHeader, "true")
	}
	rw.WriteHeader(resp.Status)
	_, _ = rw.Write(resp.Body)
}

func writeRequestError(rw http.ResponseWriter, err error, status int) {
	var re *RequestError
	if !errors.As(err, &re) {
		writeProblem(rw, status, "invalid-request", http.StatusText(status), err.Error(), 0)
		return
	}
	if re.Status != 0 {
		status = re.Status
	}
	p := problem{Type: "urn:atomicphase:problem:invalid-request", Title: http.StatusText(status), Status: status, Detail: re.Detail, Field: re.Field}
	writeJSONProblem(rw, p, 0)
}

// problem is an RFC 9457 problem details body.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field,omitempty"`
}

func writeProblem(rw http.ResponseWriter, status int, code, title, detail string, retryAfter int) {
	writeJSONProblem(rw, problem{Type: "urn:atomicphase:problem:" + code, Title: title, Status: status, Detail: detail}, retryAfter)
}

func writeJSONProblem(rw http.ResponseWriter, p problem, retryAfter int) {
	body, _ := json.Marshal(p) // a struct of strings and an int always encodes
	rw.Header().Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		rw.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	rw.WriteHeader(p.Status)
	_, _ = rw.Write(append(body, '\n'))
}
