package connectphase_test

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/internal/keytable"
	"github.com/atomicphase/atomicphase/protophase"
)

// TestConnectReadsTheSharedTableOfKeys sends every value of the table
// that all transports read, as header lines: an accepted key runs once
// under the table's key (its other spellings are replays), a refused one
// answers INVALID_ARGUMENT naming the Idempotency-Key header.
func TestConnectReadsTheSharedTableOfKeys(t *testing.T) {
	t.Parallel()
	c, runs := setup(t)
	keys := map[string]bool{}
	for i, tc := range keytable.Cases() {
		amount := float64(1000 + i)
		if tc.Verdict == "" {
			amount = float64(len(tc.Key)) // one key, one message
		}
		msg, _ := structpb.NewStruct(map[string]any{"amount": amount})
		req := connect.NewRequest(msg)
		for _, v := range tc.Values {
			req.Header().Add(protophase.DefaultKeyMetadata, v)
		}
		resp, err := c.CallUnary(t.Context(), req)
		switch tc.Verdict {
		case "":
			if err != nil {
				t.Errorf("%s: %v; want the answer", tc.Name, err)
				continue
			}
			if replayed := resp.Header().Get(protophase.ReplayedMetadata) == "true"; replayed != keys[tc.Key] {
				t.Errorf("%s: replayed %v; want a replay only for a key seen before", tc.Name, replayed)
			}
			keys[tc.Key] = true
		default:
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.Contains(ce.Message(), "Idempotency-Key header is ") {
				t.Errorf("%s: %v; want INVALID_ARGUMENT naming the Idempotency-Key header", tc.Name, err)
			}
		}
	}
	if n := runs.Load(); n != int64(len(keys)) {
		t.Errorf("%d runs; want one per accepted key, %d", n, len(keys))
	}
}
