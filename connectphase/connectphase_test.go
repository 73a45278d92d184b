package connectphase_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/connectphase"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/protophase"
)

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) != "" {
		// The test binary is a payments server that the chaos test kills.
		if err := runServer(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	phasetest.Main(m)
}

const procedure = "/paytest.Payments/Charge"

// setup serves a Connect handler for procedure whose charge workflow
// counts its executions, and returns a client of it.
func setup(t *testing.T) (*connect.Client[structpb.Struct, structpb.Struct], *atomic.Int64) {
	t.Helper()
	runs := new(atomic.Int64)
	type in = phase.Input[protophase.Request[*structpb.Struct], struct{}]
	w, err := phase.NewWorkflow("charge", phase.Local("charged", func(ctx context.Context, tx pgx.Tx, r *in) (phase.Result, error) {
		amount := r.Req.Message.GetFields()["amount"].GetNumberValue()
		if amount > 10000 {
			return protophase.Fail(code.Code_FAILED_PRECONDITION, "card declined"), nil
		}
		n := runs.Add(1)
		s, err := structpb.NewStruct(map[string]any{"amount": amount, "charge": float64(n)})
		if err != nil {
			return phase.Result{}, err
		}
		return protophase.Reply(s), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := phase.NewClient(phasetest.Pool(t), &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))}, w)
	if err != nil {
		t.Fatal(err)
	}
	s, err := connectphase.NewServer(c, connectphase.Config{Tenant: func(context.Context, http.Header) (string, error) { return "acme", nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := connectphase.Handle[*structpb.Struct, structpb.Struct](s, procedure, w, connectphase.MethodConfig[*structpb.Struct]{}); err != nil {
		t.Fatal(err)
	}
	h := connect.NewUnaryHandler(procedure, func(context.Context, *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("served by the workflow"))
	}, connect.WithInterceptors(s.Interceptor()))
	mux := http.NewServeMux()
	mux.Handle(procedure, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+procedure), runs
}

func charge(t *testing.T, c *connect.Client[structpb.Struct, structpb.Struct], key string, amount float64) (*connect.Response[structpb.Struct], error) {
	t.Helper()
	msg, _ := structpb.NewStruct(map[string]any{"amount": amount})
	req := connect.NewRequest(msg)
	if key != "" {
		req.Header().Set(protophase.DefaultKeyMetadata, key)
	}
	return c.CallUnary(t.Context(), req)
}

func TestAConnectCallRunsOnceAndItsRetryIsReplayed(t *testing.T) {
	t.Parallel()
	c, runs := setup(t)
	first, err := charge(t, c, "k", 500)
	if err != nil {
		t.Fatal(err)
	}
	again, err := charge(t, c, "k", 500)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first.Msg, again.Msg) || first.Header().Get(protophase.ReplayedMetadata) != "false" || again.Header().Get(protophase.ReplayedMetadata) != "true" {
		t.Errorf("first %v (%v), retry %v (%v); want the same message, the retry marked replayed", first.Msg, first.Header(), again.Msg, again.Header())
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the workflow ran %d times, want 1", n)
	}
}

func TestConnectCodes(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	if _, err := charge(t, c, "used", 500); err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct {
		name     string
		key      string
		amount   float64
		code     connect.Code
		replayed string
	}{
		{"missing key", "", 500, connect.CodeInvalidArgument, ""},
		{"key reused with another message", "used", 600, connect.CodeFailedPrecondition, ""},
		{"stored failure", "declined", 20000, connect.CodeFailedPrecondition, "false"},
		{"stored failure replayed", "declined", 20000, connect.CodeFailedPrecondition, "true"},
	} {
		_, err := charge(t, c, row.key, row.amount)
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != row.code || ce.Meta().Get(protophase.ReplayedMetadata) != row.replayed {
			t.Errorf("%s: %v, want %v replayed %q", row.name, err, row.code, row.replayed)
		}
	}
}

// TestAConnectReplayCarriesHTTPsSpellingOfTheMark: a client of the Connect
// protocol that reads HTTP's Idempotent-Replayed (Stripe's, package
// caller's) sees the replay too.
func TestAConnectReplayCarriesHTTPsSpellingOfTheMark(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	first, err := charge(t, c, "spelling", 300)
	if err != nil {
		t.Fatal(err)
	}
	again, err := charge(t, c, "spelling", 300)
	if err != nil {
		t.Fatal(err)
	}
	if first.Header().Get(phase.ReplayedHeader) != "" || again.Header().Get(phase.ReplayedHeader) != "true" {
		t.Errorf("Idempotent-Replayed %q then %q; want none then true", first.Header().Get(phase.ReplayedHeader), again.Header().Get(phase.ReplayedHeader))
	}
}
