package grpcphase_test

// The complete example of docs/grpc.md, between the markers below, which
// TestDocsGRPCQuotesTheCompiledExample keeps identical to the page, and
// which TestTheDocsExampleChargesOnceAndReplays runs.

// example:begin
import (
	"context"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/grpcphase"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/protophase"
)

// With generated code, ChargeRequest and ChargeResponse are your messages
// and requestID is (*pb.ChargeRequest).GetRequestId; this example uses
// structpb so that it needs no protoc.
type (
	ChargeRequest  = structpb.Struct
	ChargeResponse = structpb.Struct
)

func requestID(req *ChargeRequest) string { return req.GetFields()["request_id"].GetStringValue() }

// Provider charges a card under a downstream idempotency key.
type Provider interface {
	Charge(ctx context.Context, key string, amount int64) (chargeID string, err error)
}

type chargeState struct{ ChargeID string }
type in = phase.Input[protophase.Request[*ChargeRequest], chargeState]

const chargesTable = `CREATE TABLE IF NOT EXISTS charges (key_id uuid PRIMARY KEY, charge_id text NOT NULL)`

// serveCharges serves /pay.Payments/Charge on lis until ctx ends. The
// database must hold atomicphase's schema (atomicphase.Migrate).
func serveCharges(ctx context.Context, pool *pgxpool.Pool, lis net.Listener, provider Provider) error {
	if _, err := pool.Exec(ctx, chargesTable); err != nil {
		return err
	}
	w, err := phase.NewWorkflow("charge",
		phase.Foreign("charged",
			func(ctx context.Context, r *in) (string, error) {
				amount := int64(r.Req.Message.GetFields()["amount"].GetNumberValue())
				return provider.Charge(ctx, r.DownstreamKey(), amount)
			},
			func(ctx context.Context, tx pgx.Tx, r *in, id string) (phase.Result, error) {
				r.State.ChargeID = id
				_, err := tx.Exec(ctx, `INSERT INTO charges (key_id, charge_id) VALUES ($1, $2)`, r.ID, id)
				return phase.Next(), err
			}).Repeatable(),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, r *in) (phase.Result, error) {
			resp, err := structpb.NewStruct(map[string]any{"charge_id": r.State.ChargeID})
			if err != nil {
				return phase.Result{}, err
			}
			return protophase.Reply(resp), nil
		}))
	if err != nil {
		return err
	}
	client, err := phase.NewClient(pool, &phase.Config{}, w)
	if err != nil {
		return err
	}
	// The completer finishes calls whose caller never came back.
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.WithoutCancel(ctx))

	s, err := grpcphase.NewServer(client, grpcphase.Config{Tenant: tenantFromToken})
	if err != nil {
		return err
	}
	err = grpcphase.Handle[*ChargeRequest, *ChargeResponse](s, "/pay.Payments/Charge", w,
		grpcphase.MethodConfig[*ChargeRequest]{Key: requestID}) // AIP-155; omit to read the metadata only
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(s.UnaryInterceptor()), grpc.StreamInterceptor(s.StreamInterceptor()))
	srv.RegisterService(&paymentsService, nil) // generated: pb.RegisterPaymentsServer(srv, unimplemented{})
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	return srv.Serve(lis)
}

// tenantFromToken finds the caller's account from its bearer token.
func tenantFromToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if account, ok := strings.CutPrefix(v, "Bearer "); ok && account != "" {
			return account, nil
		}
	}
	return "", status.Error(codes.Unauthenticated, "send your token in authorization")
}

// charge charges amount under requestID (sent as the request_id field and,
// by the interceptor, in the idempotency-key metadata) and reports whether
// the answer was replayed. An *grpcphase.UnknownOutcomeError carries the
// key to call again with.
func charge(ctx context.Context, addr, token, id string, amount float64) (*ChargeResponse, bool, error) {
	ic, err := grpcphase.UnaryClientInterceptor(grpcphase.ClientConfig{
		Key: func(req any) string { return requestID(req.(*ChargeRequest)) }, // generated messages need no Key
	})
	if err != nil {
		return nil, false, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithUnaryInterceptor(ic), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, false, err
	}
	defer conn.Close()
	req, err := structpb.NewStruct(map[string]any{"request_id": id, "amount": amount})
	if err != nil {
		return nil, false, err
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	resp := new(ChargeResponse)
	var header metadata.MD
	// generated: pb.NewPaymentsClient(conn).Charge(ctx, req, grpc.Header(&header))
	err = conn.Invoke(ctx, "/pay.Payments/Charge", req, resp, grpc.Header(&header))
	return resp, grpcphase.Replayed(header), err
}

// example:end

// paymentsService is what protoc generates for the service, written by
// hand for structpb messages.
var paymentsService = grpc.ServiceDesc{
	ServiceName: "pay.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := new(ChargeRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			unimplemented := func(context.Context, any) (any, error) {
				return nil, status.Error(codes.Unimplemented, "Charge is answered by its workflow")
			}
			return interceptor(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/pay.Payments/Charge"}, unimplemented)
		}}},
}
