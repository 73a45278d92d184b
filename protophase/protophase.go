package protophase

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// DefaultKeyMetadata is the metadata key (a gRPC metadata name, an HTTP
// header for Connect) that carries the idempotency key by default.
const DefaultKeyMetadata = "idempotency-key"

// ReplayedMetadata is set to "true" in the header metadata of an answer
// replayed from a stored key.
const ReplayedMetadata = "idempotency-replayed"

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail attached to
// every refusal, so that a client tells this library's refusals from the
// service's own errors of the same code.
const ErrorDomain = "atomicphase.dev"

// The reasons of the ErrorInfo details, one per refusal a client may
// branch on.
const (
	ReasonInFlight            = "IN_FLIGHT"
	ReasonOnHold              = "ON_HOLD"
	ReasonKeyReused           = "IDEMPOTENCY_KEY_REUSED"
	ReasonMissingKey          = "IDEMPOTENCY_KEY_MISSING"
	ReasonInvalidKey          = "IDEMPOTENCY_KEY_INVALID"
	ReasonStoreUnavailable    = "STORE_UNAVAILABLE"
	ReasonDefinitionElsewhere = "DEFINITION_ELSEWHERE"
	ReasonTimeout             = "RUN_TIMEOUT"
	ReasonShuttingDown        = "SHUTTING_DOWN"
	ReasonOutcomeUnknown      = "OUTCOME_UNKNOWN"
	ReasonInterrupted         = "RUN_INTERRUPTED"
	ReasonRunFailed           = "RUN_FAILED"
	ReasonInvalidRequest      = "INVALID_REQUEST"
)

// messageType is the media type of a stored response message.
const messageType = "application/x-protobuf"

// statusType is the media type of a stored google.rpc.Status.
const statusType = "application/x-protobuf; proto=google.rpc.Status"

// Request is the request of a workflow served over gRPC or Connect: the
// full method it was sent to ("/pkg.Service/Method") and its message.
//
// A key stores it as JSON: the method and the message's deterministic
// binary encoding (proto.MarshalOptions{Deterministic: true}) in base64.
// Workflow.Run fingerprints that JSON, so a key's fingerprint covers the
// method and every field the client set, unknown ones included, and not
// the server's Go types: a deploy that adds a field to the message keeps
// the fingerprints of retries from older clients. The completer rebuilds
// the message from the stored bytes.
type Request[M proto.Message] struct {
	Method  string
	Message M
}

type storedRequest struct {
	Method  string `json:"method"`
	Message []byte `json:"message"`
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// MarshalJSON encodes r as a key stores it.
func (r Request[M]) MarshalJSON() ([]byte, error) {
	var body []byte
	if any(r.Message) != nil {
		var err error
		if body, err = deterministic.Marshal(r.Message); err != nil {
			return nil, fmt.Errorf("protophase: encode %s: %w", r.Method, err)
		}
	}
	return json.Marshal(storedRequest{Method: r.Method, Message: body})
}

// UnmarshalJSON decodes a request as a key stores it.
func (r *Request[M]) UnmarshalJSON(b []byte) error {
	var s storedRequest
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	m := newMessage[M]()
	if err := proto.Unmarshal(s.Message, m); err != nil {
		return fmt.Errorf("protophase: decode %s: %w", s.Method, err)
	}
	r.Method, r.Message = s.Method, m
	return nil
}

// newMessage returns a new, empty M. Generated messages describe their type
// even through a nil pointer.
func newMessage[M proto.Message]() M {
	var zero M
	return zero.ProtoReflect().Type().New().Interface().(M)
}

// Reply ends a workflow with m as the method's response. The key stores m's
// deterministic encoding, and every retry gets an identical message back.
func Reply(m proto.Message) phase.Result { return respond(reply(m)) }

// Fail ends a workflow with an error status, stored like a response and
// replayed identically, details included (each packed in an Any): use it
// for a final answer such as a declined card (FAILED_PRECONDITION) that
// retries must get again. An error a phase returns instead is never
// stored, and a retry resumes the workflow. The code must not be OK; OK is
// stored as UNKNOWN.
func Fail(c code.Code, message string, details ...proto.Message) phase.Result {
	return respond(fail(c, message, details...))
}

func respond(r keyrow.Response) phase.Result { return phase.Respond(r.Status, r.Header, r.Body) }

// reply is the stored form of a response message.
func reply(m proto.Message) keyrow.Response {
	body, err := deterministic.Marshal(m)
	if err != nil {
		// A message that cannot be encoded cannot be sent either: answer
		// what the server would.
		return fail(code.Code_INTERNAL, "the response could not be encoded: "+err.Error())
	}
	return keyrow.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {messageType}}, Body: body}
}

// fail is the stored form of an error status.
func fail(c code.Code, message string, details ...proto.Message) keyrow.Response {
	if c == code.Code_OK {
		c = code.Code_UNKNOWN
	}
	st := &spb.Status{Code: int32(c), Message: message}
	for _, d := range details {
		a, err := anypb.New(d)
		if err != nil {
			return fail(code.Code_INTERNAL, "an error detail could not be encoded: "+err.Error())
		}
		st.Details = append(st.Details, a)
	}
	body, err := deterministic.Marshal(st)
	if err != nil {
		return fail(code.Code_INTERNAL, "the error status could not be encoded: "+err.Error())
	}
	return keyrow.Response{Status: HTTPStatus(c), Header: http.Header{"Content-Type": {statusType}}, Body: body}
}

// HTTPStatus is the HTTP status a stored error status is kept under, the
// one Connect answers for its code, so that the status an operator sees
// in the console reads as the HTTP contract would.
func HTTPStatus(c code.Code) int {
	switch c {
	case code.Code_CANCELLED:
		return 499
	case code.Code_INVALID_ARGUMENT, code.Code_FAILED_PRECONDITION, code.Code_OUT_OF_RANGE:
		return http.StatusBadRequest
	case code.Code_DEADLINE_EXCEEDED:
		return http.StatusGatewayTimeout
	case code.Code_NOT_FOUND:
		return http.StatusNotFound
	case code.Code_ALREADY_EXISTS, code.Code_ABORTED:
		return http.StatusConflict
	case code.Code_PERMISSION_DENIED:
		return http.StatusForbidden
	case code.Code_RESOURCE_EXHAUSTED:
		return http.StatusTooManyRequests
	case code.Code_UNIMPLEMENTED:
		return http.StatusNotImplemented
	case code.Code_UNAVAILABLE:
		return http.StatusServiceUnavailable
	case code.Code_UNAUTHENTICATED:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// ErrNotAnAnswer is returned by Answer for a stored response that neither
// Reply nor Fail made: the workflow answered with phase.Respond or
// phase.JSON, which a gRPC or Connect client cannot receive.
var ErrNotAnAnswer = errors.New("protophase: the stored response is not a protobuf answer; end the workflow with Reply or Fail")

// Answer decodes a stored response: the response message Reply stored, or
// else the error status Fail stored.
func Answer[M proto.Message](resp *keyrow.Response) (M, *spb.Status, error) {
	var zero M
	if resp.Status == http.StatusOK {
		m := newMessage[M]()
		if err := proto.Unmarshal(resp.Body, m); err != nil {
			return zero, nil, fmt.Errorf("%w: %w", ErrNotAnAnswer, err)
		}
		return m, nil, nil
	}
	st := &spb.Status{}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), statusType) {
		return zero, nil, fmt.Errorf("%w: status %d, Content-Type %q", ErrNotAnAnswer, resp.Status, resp.Header.Get("Content-Type"))
	}
	if err := proto.Unmarshal(resp.Body, st); err != nil || st.Code == int32(code.Code_OK) {
		return zero, nil, fmt.Errorf("%w: status %d", ErrNotAnAnswer, resp.Status)
	}
	return zero, st, nil
}

// Refusal is the error status that answers a call whose run gave no
// answer: the key is in flight, on hold, reused, or the run failed.
type Refusal struct {
	Code    code.Code
	Message string
	// Reason is the ErrorInfo reason (one of the Reason constants), in
	// ErrorDomain.
	Reason string
	// RetryAfter, when positive, is the least pause before a retry with
	// the same key, sent as a google.rpc.RetryInfo detail.
	RetryAfter time.Duration
}

// Status returns the refusal as a google.rpc.Status with its ErrorInfo
// and, when RetryAfter is set, RetryInfo details.
func (r Refusal) Status() *spb.Status {
	st := &spb.Status{Code: int32(r.Code), Message: r.Message}
	info, _ := anypb.New(&errdetails.ErrorInfo{Reason: r.Reason, Domain: ErrorDomain})
	st.Details = append(st.Details, info)
	if r.RetryAfter > 0 {
		retry, _ := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryAfter)})
		st.Details = append(st.Details, retry)
	}
	return st
}

// retrySafe ends the message of every refusal after which a retry with
// the same key is safe.
const retrySafe = "; nothing of the interrupted step was kept, and retrying with the same idempotency key resumes the call safely"

// Refuse returns the refusal for a run that ended with err, or with out
// when out has no response (in flight, on hold, mismatch, elsewhere). It is
// the one table grpcphase and connectphase answer with; docs/grpc.md
// explains each row.
func Refuse(out *phase.Outcome, err error) Refusal {
	const second = time.Second
	var pe *phase.PanicError
	switch {
	case err == nil && out != nil:
		switch out.Kind {
		case phase.OutcomeInFlight:
			return Refusal{code.Code_ABORTED, "another call with this idempotency key is in flight; retry with the same key after the delay", ReasonInFlight, out.RetryAfter}
		case phase.OutcomeOnHold:
			msg := "the outcome of this call is being reconciled with a downstream service; retry later with the same idempotency key"
			if out.Hold == keyrow.HoldDead {
				msg = "processing of this call was stopped, after repeated failures or by an operator; an operator must retry it"
			}
			return Refusal{code.Code_ABORTED, msg, ReasonOnHold, out.RetryAfter}
		case phase.OutcomeMismatch:
			return Refusal{code.Code_FAILED_PRECONDITION, "this idempotency key was already used with a different request; use a new key for a new request", ReasonKeyReused, 0}
		case phase.OutcomeElsewhere:
			return Refusal{code.Code_UNAVAILABLE, fmt.Sprintf("this call started under definition %s of the workflow, which this server does not run; a server that runs it will finish it, so retry later with the same idempotency key", out.Definition), ReasonDefinitionElsewhere, out.RetryAfter}
		}
		return Refusal{code.Code_INTERNAL, fmt.Sprintf("the run ended as %q without an answer", out.Kind), ReasonRunFailed, 0}
	case errors.Is(err, phase.ErrCrash):
		// As a killed server's client sees it: the transport is gone.
		return Refusal{code.Code_UNAVAILABLE, "the server stopped before answering" + retrySafe, ReasonInterrupted, 0}
	case errors.Is(err, keyrow.ErrKeyInvalid):
		return Refusal{code.Code_INVALID_ARGUMENT, strings.TrimPrefix(err.Error(), "keyrow: "), ReasonInvalidKey, 0}
	case errors.Is(err, keyrow.ErrInvalidTenant), errors.Is(err, phase.ErrInvalidRequest):
		return Refusal{code.Code_INVALID_ARGUMENT, strings.TrimPrefix(strings.TrimPrefix(err.Error(), "keyrow: "), "phase: "), ReasonInvalidRequest, 0}
	case errors.Is(err, phase.ErrStopped):
		// Before ErrUnavailable: a run cut short by Stop is both.
		return Refusal{code.Code_UNAVAILABLE, "the server is shutting down" + retrySafe, ReasonShuttingDown, second}
	case errors.Is(err, phase.ErrUnavailable):
		return Refusal{code.Code_UNAVAILABLE, "the idempotency key store is unavailable" + retrySafe, ReasonStoreUnavailable, second}
	case errors.Is(err, phase.ErrDefinitionElsewhere):
		return Refusal{code.Code_UNAVAILABLE, "this call started under a workflow definition this server does not run; retry later with the same idempotency key", ReasonDefinitionElsewhere, second}
	case errors.Is(err, phase.ErrRunTimeout):
		return Refusal{code.Code_UNAVAILABLE, "processing took longer than the server allows" + retrySafe, ReasonTimeout, second}
	case errors.Is(err, keyrow.ErrLeaseLost):
		return Refusal{code.Code_ABORTED, "another call with this idempotency key took over processing; retry with the same key", ReasonInFlight, second}
	case errors.Is(err, phase.ErrOutcomeUnknown):
		return Refusal{code.Code_UNAVAILABLE, "a downstream service did not confirm the operation; retry with the same idempotency key and it will be completed exactly once", ReasonOutcomeUnknown, second}
	case errors.As(err, &pe):
		return Refusal{code.Code_INTERNAL, "the call failed part-way because of a server bug and nothing was stored as its answer; retrying with the same idempotency key resumes it safely", ReasonRunFailed, 0}
	}
	return Refusal{code.Code_INTERNAL, "the call failed part-way and nothing was stored as its answer; retrying with the same idempotency key resumes it safely", ReasonRunFailed, 0}
}

// Key is KeyFrom for the default metadata, DefaultKeyMetadata.
func Key(metadata []string, field string) (string, *Refusal) {
	return KeyFrom(DefaultKeyMetadata+" metadata", metadata, field)
}

// KeyFrom returns the call's idempotency key from the values of its key
// metadata, carrier naming that metadata for messages ("idempotency-key
// metadata", "Idempotency-Key header"), and, for a method whose request carries its key in
// a field (Google's AIP-155 request_id, AEP-155's idempotency_key), that
// field's value. Each is read by keyrow.KeyFrom, as the HTTP handler reads
// the Idempotency-Key header: spaces around a key are ignored, a quoted
// key is its content, and several values or a list are refused. An empty
// field or metadata counts as absent. Both may be given only when they
// hold the same key. A missing, invalid or disagreeing key is refused with
// INVALID_ARGUMENT, in a message that names the metadata or the field.
func KeyFrom(carrier string, metadata []string, field string) (string, *Refusal) {
	var fromField, fromMetadata string
	if field != "" {
		k, err := keyrow.KeyFrom("the request's key field", field)
		if err != nil && !errors.Is(err, keyrow.ErrKeyMissing) {
			return "", &Refusal{Code: code.Code_INVALID_ARGUMENT, Message: err.Error(), Reason: ReasonInvalidKey}
		}
		fromField = k
	}
	if len(metadata) > 0 {
		k, err := keyrow.KeyFrom(carrier, metadata...)
		if err != nil && !errors.Is(err, keyrow.ErrKeyMissing) {
			return "", &Refusal{Code: code.Code_INVALID_ARGUMENT, Message: err.Error(), Reason: ReasonInvalidKey}
		}
		fromMetadata = k
	}
	switch {
	case fromField != "" && fromMetadata != "" && fromField != fromMetadata:
		return "", &Refusal{Code: code.Code_INVALID_ARGUMENT, Message: fmt.Sprintf("the idempotency key in the %s (%q) differs from the one in the request's key field (%q); send one key, or the same in both", carrier, fromMetadata, fromField), Reason: ReasonInvalidKey}
	case fromField != "":
		return fromField, nil
	case fromMetadata != "":
		return fromMetadata, nil
	}
	return "", &Refusal{Code: code.Code_INVALID_ARGUMENT, Message: fmt.Sprintf("%s is missing, and no request field carries a key: the call has no idempotency key; send one, the same on every retry", carrier), Reason: ReasonMissingKey}
}
