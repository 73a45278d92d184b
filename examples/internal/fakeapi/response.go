package fakeapi

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Response is a status and JSON body: what an executed request answers, and
// what its idempotency key stores for replay.
type Response struct {
	Status int
	Body   []byte
}

// JSON renders v as Stripe does, indented with two spaces. It panics if v
// does not marshal: the fakes pass only types that always do.
func JSON(status int, v any) Response {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("fakeapi: marshal %T: %v", v, err))
	}
	return Response{Status: status, Body: append(body, '\n')}
}

// Write answers w with res.
func Write(w http.ResponseWriter, res Response) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// Error is the "error" object of Stripe's error responses.
type Error struct {
	Type        string `json:"type"`
	Code        string `json:"code,omitempty"`
	DeclineCode string `json:"decline_code,omitempty"`
	Message     string `json:"message"`
	Param       string `json:"param,omitempty"`
}

// ErrorResponse is an error answer with status, its body {"error": e}.
func ErrorResponse(status int, e Error) Response {
	return JSON(status, struct {
		Error Error `json:"error"`
	}{e})
}

// InvalidParam is a 400 invalid_request_error naming the parameter at fault
// (none when param is empty). It is a pointer so that validators can return
// nil for a request they accept.
func InvalidParam(param, code, message string) *Response {
	res := ErrorResponse(http.StatusBadRequest, Error{
		Type:    "invalid_request_error",
		Code:    code,
		Message: message,
		Param:   param,
	})
	return &res
}

// ServerError is the answer to a failure of the server itself, injected or
// not; Stripe gives no detail either.
var ServerError = ErrorResponse(http.StatusInternalServerError, Error{
	Type:    "api_error",
	Message: "An unknown error occurred",
})

// unrecognized answers a path or method no route serves, in Stripe's words.
func unrecognized(w http.ResponseWriter, r *http.Request) {
	Write(w, ErrorResponse(http.StatusNotFound, Error{
		Type:    "invalid_request_error",
		Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path),
	}))
}

// NotFound is Stripe's answer to a request for an object that does not
// exist: 404 resource_missing, naming the object's kind (charge) and the ID
// asked for.
func NotFound(kind, id string) Response {
	return ErrorResponse(http.StatusNotFound, Error{
		Type:    "invalid_request_error",
		Code:    "resource_missing",
		Message: fmt.Sprintf("No such %s: '%s'", kind, id),
		Param:   "id",
	})
}
