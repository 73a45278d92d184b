package grpcphase_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/grpcphase"
	"github.com/atomicphase/atomicphase/grpcphase/internal/paytest"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/protophase"
)

func TestChargeRunsOnceAndItsRetryGetsTheIdenticalMessageMarkedReplayed(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	ctx := context.Background()
	first, header, err := call(ctx, e.raw, "k-1", paytest.Request(500, ""))
	if err != nil {
		t.Fatal(err)
	}
	if grpcphase.Replayed(header) {
		t.Error("the first call's answer is marked replayed")
	}
	again, header, err := call(ctx, e.raw, "k-1", paytest.Request(500, ""))
	if err != nil {
		t.Fatal(err)
	}
	if !grpcphase.Replayed(header) {
		t.Errorf("the retry's header %v has no %s: true", header, protophase.ReplayedMetadata)
	}
	a, _ := proto.MarshalOptions{Deterministic: true}.Marshal(first)
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(again)
	if string(a) != string(b) || first.Fields["charge_id"].GetStringValue() == "" {
		t.Errorf("the retry got %v, the first call %v", again, first)
	}
	if n := e.effects(t); n != 1 {
		t.Errorf("the provider saw %d downstream keys, want 1", n)
	}
	e.charged(t, 1)
}

func TestAStoredErrorStatusIsReplayedWithItsDetails(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	ctx := context.Background()
	for i, want := range []bool{false, true} {
		_, md, err := call(ctx, e.raw, "declined", paytest.Request(paytest.DeclineAbove+1, ""))
		st := status.Convert(err)
		if st.Code() != codes.FailedPrecondition || st.Message() != "card declined" {
			t.Fatalf("call %d: %v, want the stored FAILED_PRECONDITION card declined", i, err)
		}
		if reason, _ := details(err); reason != "CARD_DECLINED" {
			t.Errorf("call %d: detail reason %q, want CARD_DECLINED", i, reason)
		}
		if grpcphase.Replayed(md) != want {
			t.Errorf("call %d: replayed %v, want %v (metadata %v)", i, grpcphase.Replayed(md), want, md)
		}
	}
	if n := e.effects(t); n != 0 {
		t.Errorf("a declined charge reached the provider under %d keys", n)
	}
}

// TestTheKeyMayComeFromARequestField runs a method whose request carries
// its key in request_id, as AIP-155 has it.
func TestTheKeyMayComeFromARequestField(t *testing.T) {
	t.Parallel()
	e := setup(t, options{key: paytest.RequestID})
	ctx := context.Background()
	if _, _, err := call(ctx, e.raw, "", paytest.Request(500, "rid-1")); err != nil {
		t.Fatal(err)
	}
	if _, md, err := call(ctx, e.raw, "rid-1", paytest.Request(500, "rid-1")); err != nil || !grpcphase.Replayed(md) {
		t.Errorf("metadata and field agreeing: %v, replayed %v; want the replay", err, grpcphase.Replayed(md))
	}
	if _, _, err := call(ctx, e.raw, "other", paytest.Request(500, "rid-1")); status.Code(err) != codes.InvalidArgument {
		t.Errorf("metadata and field disagreeing: %v, want INVALID_ARGUMENT", err)
	}
	if _, _, err := call(ctx, e.raw, "", paytest.Request(500, "")); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no key at all: %v, want INVALID_ARGUMENT", err)
	}
	if n := e.effects(t); n != 1 {
		t.Errorf("the provider saw %d downstream keys, want 1", n)
	}
}

// TestStatusMapping checks each row of the table in docs/grpc.md through a
// real server.
func TestStatusMapping(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	ctx := context.Background()
	if _, _, err := call(ctx, e.raw, "used", paytest.Request(500, "")); err != nil {
		t.Fatal(err)
	}
	// A call held inside its provider call keeps its key in flight.
	held, release := make(chan struct{}), make(chan struct{})
	const heldAmount = 777
	e.provider.Before = func(ctx context.Context, key string, amount int64) error {
		if amount == heldAmount {
			close(held)
			<-release
		}
		return nil
	}
	var wg sync.WaitGroup
	wg.Go(func() { _, _, _ = call(ctx, e.raw, "held", paytest.Request(heldAmount, "")) })
	<-held
	t.Cleanup(func() { close(release); wg.Wait() })

	for _, row := range []struct {
		name   string
		key    string
		req    *structpb.Struct
		pairs  []string
		code   codes.Code
		reason string
		retry  bool
	}{
		{name: "missing key", code: codes.InvalidArgument, reason: protophase.ReasonMissingKey},
		{name: "two keys", key: "a", pairs: []string{protophase.DefaultKeyMetadata, "b"}, code: codes.InvalidArgument, reason: protophase.ReasonInvalidKey},
		{name: "invalid key", key: strings.Repeat("k", 300), code: codes.InvalidArgument, reason: protophase.ReasonInvalidKey},
		{name: "no tenant", key: "t", pairs: []string{"x-tenant", ""}, code: codes.Unauthenticated},
		{name: "tenant store down", key: "t", pairs: []string{"x-tenant", "down"}, code: codes.Unavailable, reason: protophase.ReasonStoreUnavailable, retry: true},
		{name: "tenant refused with its own status", key: "t", pairs: []string{"x-tenant", "forbidden"}, code: codes.PermissionDenied},
		{name: "key reused with another message", key: "used", req: paytest.Request(600, ""), code: codes.FailedPrecondition, reason: protophase.ReasonKeyReused},
		{name: "key in flight", key: "held", req: paytest.Request(heldAmount, ""), code: codes.Aborted, reason: protophase.ReasonInFlight, retry: true},
		{name: "injected crash", key: "crashing", pairs: []string{"x-crash-at", "reserved/before_commit"}, code: codes.Unavailable, reason: protophase.ReasonInterrupted},
		{name: "stored failure", key: "declined", req: paytest.Request(paytest.DeclineAbove+1, ""), code: codes.FailedPrecondition, reason: "CARD_DECLINED"},
	} {
		t.Run(row.name, func(t *testing.T) {
			req := row.req
			if req == nil {
				req = paytest.Request(500, "")
			}
			_, _, err := call(ctx, e.raw, row.key, req, row.pairs...)
			if status.Code(err) != row.code {
				t.Fatalf("%v, want %v", err, row.code)
			}
			reason, retry := details(err)
			if reason != row.reason {
				t.Errorf("reason %q, want %q", reason, row.reason)
			}
			if (retry > 0) != row.retry {
				t.Errorf("RetryInfo delay %v, want one: %v", retry, row.retry)
			}
		})
	}

	t.Run("store down", func(t *testing.T) {
		pool := phasetest.Pool(t)
		down := setup(t, options{pool: pool})
		pool.Close()
		_, _, err := call(ctx, down.raw, "k", paytest.Request(500, ""))
		if reason, retry := details(err); status.Code(err) != codes.Unavailable || reason != protophase.ReasonStoreUnavailable || retry <= 0 {
			t.Errorf("%v (reason %q, retry %v), want UNAVAILABLE with a retry delay", err, reason, retry)
		}
	})
	t.Run("definition elsewhere", func(t *testing.T) {
		// The key started under another definition of the workflow (one
		// phase fewer) and crashed there.
		older, err := phase.NewWorkflow("charge", phase.Local("reserved", func(context.Context, pgx.Tx, *paytest.In) (phase.Result, error) {
			return phase.Next(), nil
		}), phase.Local("answered", func(context.Context, pgx.Tx, *paytest.In) (phase.Result, error) {
			return protophase.Reply(&structpb.Struct{}), nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		oc, err := phase.NewClient(e.pool, &phase.Config{Logger: quiet(t)}, older)
		if err != nil {
			t.Fatal(err)
		}
		crash := phase.WithInjector(ctx, phase.CrashAt(phase.Point{Phase: "answered", Stage: phase.BeforeTx}))
		req := protophase.Request[*structpb.Struct]{Method: paytest.Charge, Message: paytest.Request(500, "")}
		if _, err := older.Run(crash, oc, "acme", "old", req); !errors.Is(err, phase.ErrCrash) {
			t.Fatalf("older definition's run: %v", err)
		}
		if _, err := oc.Unlock(ctx, "acme", "old"); err != nil {
			t.Fatal(err)
		}
		_, _, err = call(ctx, e.raw, "old", paytest.Request(500, ""))
		if reason, retry := details(err); status.Code(err) != codes.Unavailable || reason != protophase.ReasonDefinitionElsewhere || retry <= 0 {
			t.Errorf("%v (reason %q, retry %v), want UNAVAILABLE DEFINITION_ELSEWHERE with a retry delay", err, reason, retry)
		}
	})
	t.Run("unregistered method passes through", func(t *testing.T) {
		resp := new(structpb.Struct)
		if err := e.raw.Invoke(ctx, paytest.Ping, paytest.Request(1, ""), resp); err != nil || resp.Fields["amount"].GetNumberValue() != 1 {
			t.Errorf("Ping: %v %v, want its echo", resp, err)
		}
	})
	t.Run("stream refused", func(t *testing.T) {
		keyed := metadata.AppendToOutgoingContext(ctx, protophase.DefaultKeyMetadata, "k")
		s, err := e.raw.NewStream(keyed, &paytest.Service.Streams[0], paytest.Watch)
		if err == nil {
			_ = s.CloseSend()
			err = s.RecvMsg(new(structpb.Struct))
		}
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("%v, want UNIMPLEMENTED", err)
		}
	})
}

// TestHundredIdenticalCallsRunOnce sends one call 100 times at once, under
// one key, through the client interceptor: every call gets the one
// answer, and the workflow ran once.
func TestHundredIdenticalCallsRunOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	ctx := metadata.AppendToOutgoingContext(context.Background(), protophase.DefaultKeyMetadata, "same")
	answers := make([]*structpb.Struct, 100)
	errs := make([]error, 100)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i], _, errs[i] = call(ctx, e.conn, "", paytest.Request(500, "")) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if !proto.Equal(answers[i], answers[0]) {
			t.Errorf("call %d got %v, call 0 %v", i, answers[i], answers[0])
		}
	}
	if n := e.effects(t); n != 1 {
		t.Errorf("the provider saw %d downstream keys, want 1", n)
	}
	e.charged(t, 1)
}

// TestACrashBehindTheInterceptorIsResumedByTheClientsRetry crashes the
// server's run at every fault point of the workflow, as a killed process
// would stop (its lease kept until it expires), and lets the client
// interceptor's retries finish each call: each gets the answer, one
// charge row, one provider call.
func TestACrashBehindTheInterceptorIsResumedByTheClientsRetry(t *testing.T) {
	t.Parallel()
	e := setup(t, options{leaseTTL: time.Second})
	ctx := context.Background()
	var rec phase.Recorder
	req := protophase.Request[*structpb.Struct]{Method: paytest.Charge, Message: paytest.Request(500, "")}
	if _, err := e.workflow.Run(phase.WithInjector(ctx, &rec), e.client, "acme", "discover", req); err != nil {
		t.Fatal(err)
	}
	points := rec.Points()
	if len(points) < 6 {
		t.Fatalf("the workflow passed only %v", points)
	}
	var wg sync.WaitGroup
	for _, p := range points {
		wg.Go(func() {
			key := "crash-" + p.Phase + "-" + string(p.Stage)
			resp, _, err := call(ctx, e.conn, key, paytest.Request(500, ""), "x-crash-at", p.String())
			if err != nil {
				t.Errorf("crash at %s: %v", p, err)
				return
			}
			if resp.Fields["charge_id"].GetStringValue() == "" {
				t.Errorf("crash at %s: answer %v has no charge", p, resp)
			}
		})
	}
	wg.Wait()
	if got := e.crashes.Load(); got != int64(len(points)) {
		t.Errorf("%d crashes injected, want %d", got, len(points))
	}
	if n := e.effects(t); n != len(points)+1 {
		t.Errorf("the provider saw %d downstream keys, want %d", n, len(points)+1)
	}
	e.charged(t, len(points)+1)
}
