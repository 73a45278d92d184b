package protophase_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/protophase"
)

// TestRefuseMapsEveryOutcomeAndError is the status table of docs/grpc.md,
// row by row.
func TestRefuseMapsEveryOutcomeAndError(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("%w: cause", err) }
	for _, row := range []struct {
		name   string
		out    *phase.Outcome
		err    error
		code   code.Code
		reason string
		retry  bool
	}{
		{"in flight", &phase.Outcome{Kind: phase.OutcomeInFlight, RetryAfter: 3 * time.Second}, nil, code.Code_ABORTED, protophase.ReasonInFlight, true},
		{"on hold", &phase.Outcome{Kind: phase.OutcomeOnHold, Hold: keyrow.HoldUnknown, RetryAfter: time.Second}, nil, code.Code_ABORTED, protophase.ReasonOnHold, true},
		{"mismatch", &phase.Outcome{Kind: phase.OutcomeMismatch}, nil, code.Code_FAILED_PRECONDITION, protophase.ReasonKeyReused, false},
		{"elsewhere", &phase.Outcome{Kind: phase.OutcomeElsewhere, Definition: "abc", RetryAfter: time.Second}, nil, code.Code_UNAVAILABLE, protophase.ReasonDefinitionElsewhere, true},
		{"store unavailable", nil, wrap(phase.ErrUnavailable), code.Code_UNAVAILABLE, protophase.ReasonStoreUnavailable, true},
		{"definition elsewhere", nil, wrap(phase.ErrDefinitionElsewhere), code.Code_UNAVAILABLE, protophase.ReasonDefinitionElsewhere, true},
		{"run timeout", nil, wrap(phase.ErrRunTimeout), code.Code_UNAVAILABLE, protophase.ReasonTimeout, true},
		{"stopping", nil, phase.ErrStopped, code.Code_UNAVAILABLE, protophase.ReasonShuttingDown, true},
		// A run Stop cut short is both, as phase's own error is.
		{"cut short by Stop", nil, fmt.Errorf("%w: %w", phase.ErrStopped, phase.ErrUnavailable), code.Code_UNAVAILABLE, protophase.ReasonShuttingDown, true},
		{"outcome unknown", nil, phase.MaybeHappened(errors.New("timeout")), code.Code_UNAVAILABLE, protophase.ReasonOutcomeUnknown, true},
		{"lease lost", nil, wrap(keyrow.ErrLeaseLost), code.Code_ABORTED, protophase.ReasonInFlight, true},
		{"crash", nil, phase.ErrCrash, code.Code_UNAVAILABLE, protophase.ReasonInterrupted, false},
		{"invalid key", nil, wrap(keyrow.ErrKeyInvalid), code.Code_INVALID_ARGUMENT, protophase.ReasonInvalidKey, false},
		{"invalid tenant", nil, wrap(keyrow.ErrInvalidTenant), code.Code_INVALID_ARGUMENT, protophase.ReasonInvalidRequest, false},
		{"invalid request", nil, wrap(phase.ErrInvalidRequest), code.Code_INVALID_ARGUMENT, protophase.ReasonInvalidRequest, false},
		{"panic", nil, &phase.PanicError{Where: "phase x", Value: 1}, code.Code_INTERNAL, protophase.ReasonRunFailed, false},
		{"phase error", nil, errors.New("boom"), code.Code_INTERNAL, protophase.ReasonRunFailed, false},
	} {
		t.Run(row.name, func(t *testing.T) {
			r := protophase.Refuse(row.out, row.err)
			if r.Code != row.code || r.Reason != row.reason || (r.RetryAfter > 0) != row.retry {
				t.Errorf("%+v, want %v %s retry %v", r, row.code, row.reason, row.retry)
			}
			if st := r.Status(); len(st.Details) != 1+btoi(row.retry) {
				t.Errorf("%d details, want ErrorInfo and RetryInfo when retried", len(st.Details))
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestRequestSurvivesTheStoredJSON(t *testing.T) {
	t.Parallel()
	msg, _ := structpb.NewStruct(map[string]any{"b": 1.0, "a": "x", "c": map[string]any{"z": true, "y": nil}})
	in := protophase.Request[*structpb.Struct]{Method: "/p.S/M", Message: msg}
	js, err := in.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		// Map order differs from one encoding to the next unless it is
		// deterministic.
		again, _ := in.MarshalJSON()
		if string(again) != string(js) {
			t.Fatalf("two encodings differ:\n%s\n%s", js, again)
		}
	}
	var out protophase.Request[*structpb.Struct]
	if err := out.UnmarshalJSON(js); err != nil {
		t.Fatal(err)
	}
	if out.Method != in.Method || !proto.Equal(out.Message, in.Message) {
		t.Errorf("decoded %v, want %v", out, in)
	}
}

func TestAnswerReadsWhatReplyAndFailStore(t *testing.T) {
	t.Parallel()
	msg, _ := structpb.NewStruct(map[string]any{"id": "ch_1"})
	for _, tc := range []struct {
		name   string
		resp   *keyrow.Response
		status int
		code   code.Code
	}{
		{"reply", protophase.ReplyResponse(msg), http.StatusOK, code.Code_OK},
		{"fail", protophase.FailResponse(code.Code_FAILED_PRECONDITION, "declined", msg), http.StatusBadRequest, code.Code_FAILED_PRECONDITION},
		{"fail with OK", protophase.FailResponse(code.Code_OK, "odd"), http.StatusInternalServerError, code.Code_UNKNOWN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.resp.Status != tc.status {
				t.Errorf("stored under %d, want %d", tc.resp.Status, tc.status)
			}
			m, st, err := protophase.Answer[*structpb.Struct](tc.resp)
			switch {
			case err != nil:
				t.Fatal(err)
			case tc.code == code.Code_OK && !proto.Equal(m, msg):
				t.Errorf("message %v, want %v", m, msg)
			case tc.code != code.Code_OK && (st == nil || st.Code != int32(tc.code)):
				t.Errorf("status %v, want %v", st, tc.code)
			}
		})
	}
	if _, _, err := protophase.Answer[*structpb.Struct](&keyrow.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte("{}")}); !errors.Is(err, protophase.ErrNotAnAnswer) {
		t.Errorf("a JSON response: %v, want ErrNotAnAnswer", err)
	}
}
