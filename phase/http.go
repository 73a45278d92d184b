package phase

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
)

// DefaultMaxBodyBytes is the largest request body Handler reads by default.
const DefaultMaxBodyBytes = 1 << 20

// ReplayedHeader is set to "true" on responses replayed from a stored key, as
// Stripe does.
const ReplayedHeader = "Idempotent-Replayed"

// Invalid returns a 422 RequestError for a request field that failed
// validation.
func Invalid(field, detail string) *RequestError {
	return &RequestError{Status: http.StatusUnprocessableEntity, Field: field, Detail: detail}
}

// HTTPConfig configures Handler. Zero values mean the documented
// default.
type HTTPConfig[Req any] struct {
	// Tenant returns whose key the request uses, from the request's
	// authentication, never its body. Required. An error answers 401 with its
	// message, or the status of a *RequestError; an error wrapping
	// ErrUnavailable (the user store is down, say) answers 503 with
	// Retry-After and the store-unavailable problem type, as an outage of the
	// key store does.
	Tenant func(r *http.Request) (string, error)
	// Decode reads the request (body limited to MaxBodyBytes) into Req
	// (default: DecodeJSON). An error answers 400 with its message, or the
	// status of a *RequestError (see Invalid), or 503 for an error wrapping
	// ErrUnavailable, as for Tenant. Requests that fail to decode are not
	// stored.
	Decode func(r *http.Request) (Req, error)
	// MaxBodyBytes limits the request body (default DefaultMaxBodyBytes);
	// a larger body answers 413.
	MaxBodyBytes int64
	// MismatchStatus answers a key reused with another request: 422 by
	// default, as the IETF draft says; Stripe-style APIs use 400.
	MismatchStatus int
	// AcceptAfter, when set, names the phase after whose commit the
	// handler answers 202 Accepted, with Location from StatusLocation and
	// Retry-After, and leaves the run to finish the remaining phases in
	// the background (the completer finishes them if this process dies).
	// A retry of the request answers 202 again while the run goes on, and
	// the final response once it is stored. Default: answer when the last
	// phase is done.
	AcceptAfter string
	// StatusLocation returns the URL at which the status of key is read
	// (see StatusHandler). Required with AcceptAfter.
	StatusLocation func(r *http.Request, key string) string
	// AdjustReplay, when set, may change a replayed response before it is
	// sent: its status, headers and body, as stored (see
	// Workflow.StoreResponses). It runs for every replay, never for the
	// response of the request that ran. Headers the request's middleware
	// already set on the ResponseWriter are kept over the stored ones.
	AdjustReplay func(r *http.Request, resp *keyrow.Response)
}

// DecodeJSON decodes a JSON request body into Req, refusing unknown fields
// and trailing data. A Content-Type other than application/json or a +json
// type is refused with 415 (a request without one is read as JSON), so a
// browser cannot skip a CORS preflight by posting text/plain.
func DecodeJSON[Req any](r *http.Request) (Req, error) {
	var req Req
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return req, &RequestError{Status: http.StatusUnsupportedMediaType,
				Detail: fmt.Sprintf("the request body must be JSON (Content-Type: application/json), not %q", ct)}
		}
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("request body is not valid JSON for this endpoint: %w", err)
	}
	switch _, err := dec.Token(); {
	case err == io.EOF:
		return req, nil
	case err != nil && isTooBig(err):
		return req, err
	}
	return req, errors.New("request body has data after the JSON value")
}

func isTooBig(err error) bool {
	var tooBig *http.MaxBytesError
	return errors.As(err, &tooBig)
}

// Handler returns an http.Handler through which c runs w for each POST
// under the Idempotency-Key header; w must be registered with c. It parses the key
// (bare or RFC 8941 quoted), finds the tenant and decodes the request with
// cfg's functions, and answers: the stored response (replays carry
// Idempotent-Replayed: true, the identical status and body, and only the
// stored headers, never over one the request's middleware set; every
// stored answer carries Content-Length); and otherwise an
// application/problem+json body (RFC 9457) that says whether retrying with
// the same key is safe:
//
//   - 400 for a missing or malformed key, several keys (on several lines or
//     comma-separated on one), or a request that can never be stored;
//   - 401 from the Tenant function, 405 for a method other than POST (with
//     Allow: POST), 413 for an oversized body, 415 for a body that is not
//     JSON (DecodeJSON);
//   - 409 with Retry-After while another request holds the key or the key
//     is on hold, and the mismatch status when the key was used with another
//     request;
//   - 503 with Retry-After when the store is unavailable or was lost
//     mid-run, the run hit its time limit, a foreign call's outcome is
//     unknown, or the client is stopping: retrying with the same key is safe;
//   - 500 for a bug in user code (a panic, or a phase's own error).
//
// Failures are never stored: the next retry resumes after the last committed
// phase.
func Handler[Req, State any](c *Client, w *Workflow[Req, State], cfg HTTPConfig[Req]) (http.Handler, error) {
	if err := c.registered(w); err != nil {
		return nil, err
	}
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
		cfg.MismatchStatus = DefaultMismatchStatus
	}
	if err := w.checkAccept(cfg.AcceptAfter, cfg.StatusLocation); err != nil {
		return nil, err
	}
	return &handler[Req, State]{w: w, c: c, cfg: cfg}, nil
}

type handler[Req, State any] struct {
	w   *Workflow[Req, State]
	c   *Client
	cfg HTTPConfig[Req]
}

func (h *handler[Req, State]) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		rw.Header().Set("Allow", http.MethodPost)
		WriteProblem(rw, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed",
			fmt.Sprintf("this endpoint accepts POST, not %s", r.Method), 0)
		return
	}
	key, ok := keyOf(rw, r)
	if !ok {
		return
	}
	tenant, ok := tenantOf(rw, r, h.cfg.Tenant, h.c.cfg.Logger, h.w.name)
	if !ok {
		return
	}
	req, fp, ok := h.decode(rw, r)
	if !ok {
		return
	}
	// Once the key is taken, the run goes on if the client hangs up: its
	// retry then finds a stored answer instead of a half-done key.
	out, err, accepted := h.runAccepting(context.WithoutCancel(r.Context()), tenant, key, req, &fp)
	if accepted {
		writeAccepted(rw, h.cfg.StatusLocation(r, key), acceptedStatus{Status: "processing", RecoveryPoint: h.cfg.AcceptAfter}, 0)
		return
	}
	if err != nil {
		writeError(rw, err)
		return
	}
	h.writeOutcome(rw, r, tenant, key, out)
}

// keyOf returns the request's idempotency key, or answers 400 when it has
// none, more than one, or an invalid one.
func keyOf(rw http.ResponseWriter, r *http.Request) (string, bool) {
	key, err := keyrow.KeyFrom(keyrow.HeaderName+" header", r.Header.Values(keyrow.HeaderName)...)
	if err != nil {
		code := ProblemInvalidKey
		if errors.Is(err, keyrow.ErrKeyMissing) {
			code = ProblemMissingKey
		}
		WriteProblem(rw, http.StatusBadRequest, code, "Invalid Idempotency-Key", err.Error(), 0)
		return "", false
	}
	return key, true
}

// decode reads the request's body, decodes it with Decode and takes the
// fingerprint of the request as sent, or answers the error.
func (h *handler[Req, State]) decode(rw http.ResponseWriter, r *http.Request) (req Req, fp [32]byte, ok bool) {
	// The body is read whole first, so that the fingerprint covers what the
	// client sent, not what Decode made of it: a deploy that changes Req
	// must not turn a retry into a mismatch.
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		h.writeBodyError(rw, err)
		return req, fp, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err := protect("Decode", "", func() (err error) {
		req, err = h.cfg.Decode(r)
		return err
	}); err != nil {
		h.writeBodyError(rw, err)
		return req, fp, false
	}
	fp, err = fingerprintSent(r, body)
	if err != nil {
		WriteProblem(rw, http.StatusBadRequest, "invalid-request", "Bad Request", requestErrorDetail(err), 0)
		return req, fp, false
	}
	return req, fp, true
}

// writeOutcome answers what the run of the key found: the response it
// stored or replays, or why it ran nothing.
func (h *handler[Req, State]) writeOutcome(rw http.ResponseWriter, r *http.Request, tenant, key string, out *Outcome) {
	switch out.Kind {
	case OutcomeReplayed:
		h.writeReplay(rw, r, key, out)
	case OutcomeNew, OutcomeResumed:
		writeStored(rw, out.Response, false)
	case OutcomeInFlight:
		h.inProgress(rw, r, tenant, key, out)
	case OutcomeOnHold:
		detail := "the outcome of a downstream operation of this request is not known, and the request waits for it to be reconciled, by the service or by an operator; retry later with the same Idempotency-Key"
		if out.Hold == keyrow.HoldDead {
			detail = "processing of this request was stopped, after repeated failures or by an operator; an operator must retry it"
		}
		WriteProblem(rw, http.StatusConflict, ProblemOnHold, "Request on hold", detail, out.RetryAfter)
	case OutcomeElsewhere:
		WriteProblem(rw, http.StatusServiceUnavailable, ProblemDefinitionUnavailable, "Request started under another version",
			fmt.Sprintf("this request started under definition %s of the workflow, which this server does not run; a server that runs it will finish it, so retry later with the same Idempotency-Key", out.Definition),
			out.RetryAfter)
	case OutcomeMismatch:
		WriteProblem(rw, h.cfg.MismatchStatus, ProblemKeyReused, "Idempotency-Key reused",
			"this Idempotency-Key was already used with a different request; use a new key for a new request", 0)
	}
}

// writeReplay sends the key's stored response again, through AdjustReplay
// when it is set, on a copy so that the stored response is not changed.
func (h *handler[Req, State]) writeReplay(rw http.ResponseWriter, r *http.Request, key string, out *Outcome) {
	if h.cfg.AdjustReplay != nil {
		resp := *out.Response
		resp.Header = out.Response.Header.Clone()
		if err := protect("AdjustReplay", "", func() error { h.cfg.AdjustReplay(r, &resp); return nil }); err != nil {
			h.c.cfg.Logger.Error("panic in user code; the stored response was not sent", "workflow", h.w.name, "key", key, "err", err)
			WriteProblem(rw, http.StatusInternalServerError, "internal-error", "Internal server error",
				"this request was already processed, but its stored response could not be sent because of a server bug; retry with the same Idempotency-Key to get it", 0)
			return
		}
		out.Response = &resp
	}
	writeStored(rw, out.Response, true)
}

// writeBodyError answers an error of reading or decoding the body.
func (h *handler[Req, State]) writeBodyError(rw http.ResponseWriter, err error) {
	if isTooBig(err) {
		WriteProblem(rw, http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
			fmt.Sprintf("the request body is larger than %d bytes", h.cfg.MaxBodyBytes), 0)
		return
	}
	writeRequestError(rw, h.c.cfg.Logger, h.w.name, err, http.StatusBadRequest)
}

// fingerprintSent is the fingerprint of r as its client sent it: the path
// and query it was sent to, before any prefix was stripped, and its body in
// its media type's canonical form (see keyrow.RequestFingerprint).
func fingerprintSent(r *http.Request, body []byte) ([32]byte, error) {
	target := r.RequestURI
	if target == "" {
		target = r.URL.RequestURI()
	}
	ct := r.Header.Get("Content-Type")
	mediaType, _, _ := mime.ParseMediaType(ct)
	if ct == "" {
		// DecodeJSON reads a body without a Content-Type as JSON.
		mediaType = "application/json"
	}
	fp, err := keyrow.RequestFingerprint(target, mediaType, body)
	if err != nil && ct == "" {
		fp, err = keyrow.RequestFingerprint(target, "", body)
	}
	if err != nil {
		return fp, fmt.Errorf("the request body cannot be fingerprinted: %w", err)
	}
	return fp, nil
}

// tenantOf returns whose key r uses, from the Tenant function f, or answers
// f's error and reports false. Handler and StatusHandler both find the
// tenant with it, so that the same error gets the same answer from both:
// 401 for a refused tenant, or the status of a *RequestError; 503 with
// Retry-After for an error wrapping ErrUnavailable, such as a user store
// that is down; 500 for a panic.
func tenantOf(rw http.ResponseWriter, r *http.Request, f func(*http.Request) (string, error), log *slog.Logger, workflow string) (string, bool) {
	var tenant string
	if err := protect("Tenant", "", func() (err error) {
		tenant, err = f(r)
		return err
	}); err != nil {
		writeRequestError(rw, log, workflow, err, http.StatusUnauthorized)
		return "", false
	}
	return tenant, true
}

// writeRequestError answers an error of the Tenant or Decode function, with
// status unless the error says otherwise. A store outage is not the
// client's mistake: an error wrapping ErrUnavailable answers as an outage
// of the key store does.
func writeRequestError(rw http.ResponseWriter, log *slog.Logger, workflow string, err error, status int) {
	var (
		re *RequestError
		pe *PanicError
	)
	switch {
	case errors.As(err, &pe):
		log.Error("panic in user code; nothing was run", "workflow", workflow, "where", pe.Where,
			"panic", pe.Value, "stack", string(pe.Stack))
		WriteProblem(rw, http.StatusInternalServerError, "internal-error", "Internal server error",
			"the request could not be read because of a server bug; nothing was processed", 0)
	case errors.Is(err, ErrUnavailable):
		writeError(rw, err)
	case errors.As(err, &re):
		status = cmp.Or(re.Status, status)
		p := problem{Type: problemType + "invalid-request", Title: http.StatusText(status), Status: status, Detail: re.Detail, Field: re.Field}
		writeJSONProblem(rw, p, 0)
	default:
		WriteProblem(rw, status, "invalid-request", http.StatusText(status), err.Error(), 0)
	}
}

// writeError answers the error of a run, or of a user function that wraps
// ErrUnavailable.
func writeError(rw http.ResponseWriter, err error) {
	const retrySafe = "; nothing of the interrupted step was kept, and retrying with the same Idempotency-Key resumes the request safely"
	var pe *PanicError
	switch {
	case errors.Is(err, ErrCrash):
		// Behave as a killed process would: the client gets no answer.
		panic(http.ErrAbortHandler)
	case errors.Is(err, keyrow.ErrInvalidTenant), errors.Is(err, keyrow.ErrKeyInvalid), errors.Is(err, ErrInvalidRequest):
		WriteProblem(rw, http.StatusBadRequest, "invalid-request", "Bad Request", requestErrorDetail(err), 0)
	case errors.Is(err, ErrStopped):
		// Before ErrUnavailable: a run cut short by Stop is both.
		WriteProblem(rw, http.StatusServiceUnavailable, ProblemShuttingDown, "Service shutting down",
			"the server is shutting down"+retrySafe, time.Second)
	case errors.Is(err, ErrUnavailable):
		WriteProblem(rw, http.StatusServiceUnavailable, ProblemStoreUnavailable, "Service unavailable",
			"the idempotency key store is unavailable"+retrySafe, time.Second)
	case errors.Is(err, ErrRunTimeout):
		WriteProblem(rw, http.StatusServiceUnavailable, ProblemTimeout, "Request timed out",
			"processing took longer than the server allows"+retrySafe, time.Second)
	case errors.Is(err, keyrow.ErrLeaseLost):
		WriteProblem(rw, http.StatusConflict, ProblemInProgress, "Request in progress",
			"another request with this Idempotency-Key took over processing; retry with the same key", time.Second)
	case errors.Is(err, ErrOutcomeUnknown):
		WriteProblem(rw, http.StatusServiceUnavailable, ProblemOutcomeUnknown, "Downstream outcome unknown",
			"a downstream service did not confirm the operation; a retry with the same Idempotency-Key completes the request without repeating it: "+
				"a call that is safe to repeat is sent again under the same downstream idempotency key, any other waits until its outcome is known, "+
				"from the service or from an operator, and the retry answers once the request is finished", time.Second)
	case errors.As(err, &pe):
		WriteProblem(rw, http.StatusInternalServerError, "internal-error", "Internal server error",
			"the request failed part-way because of a server bug and nothing was stored as its answer; retrying with the same Idempotency-Key resumes it safely", 0)
	default:
		WriteProblem(rw, http.StatusInternalServerError, "internal-error", "Internal server error",
			"the request failed part-way and nothing was stored as its answer; retrying with the same Idempotency-Key resumes it safely", 0)
	}
}

// requestErrorDetail is the client-facing part of a validation error: the
// text after the package prefix.
func requestErrorDetail(err error) string {
	msg := err.Error()
	for _, prefix := range []string{"keyrow: ", "phase: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return msg
}

// writeStored sends a response the workflow gave, with Content-Length. The
// response of the run goes out with all of its headers; a replay carries
// only the stored ones (see Workflow.StoreResponses), and never replaces a
// header that the current request's middleware has already set, such as a
// request id or a rate limit, which belong to this request.
func writeStored(rw http.ResponseWriter, resp *keyrow.Response, replayed bool) {
	hdr := rw.Header()
	for k, v := range resp.Header {
		if replayed && len(hdr.Values(k)) > 0 {
			continue
		}
		hdr[k] = v
	}
	if replayed {
		hdr.Set(ReplayedHeader, "true")
	}
	if bodyAllowed(resp.Status) {
		hdr.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	rw.WriteHeader(resp.Status)
	_, _ = rw.Write(resp.Body)
}

// bodyAllowed reports whether a response with status may carry a body and
// so a Content-Length.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// problemType prefixes the type URI of every problem the library answers.
const problemType = ProblemTypePrefix

// problem is an RFC 9457 problem details body.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field,omitempty"`
}

// WriteProblem answers an RFC 9457 application/problem+json error whose type
// is urn:atomicphase:problem:<code>, with Retry-After in whole seconds when
// retryAfter is positive. The handler answers every error with it;
// applications use it so that their own errors around the handler (404,
// 405, authentication) come in the same format.
func WriteProblem(rw http.ResponseWriter, status int, code, title, detail string, retryAfter time.Duration) {
	writeJSONProblem(rw, problem{Type: problemType + code, Title: title, Status: status, Detail: detail}, retryAfter)
}

func writeJSONProblem(rw http.ResponseWriter, p problem, retryAfter time.Duration) {
	body, _ := json.Marshal(p) // a struct of strings and an int always encodes
	rw.Header().Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		rw.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retryAfter.Seconds()))))
	}
	rw.WriteHeader(p.Status)
	_, _ = rw.Write(append(body, '\n'))
}
