package grpcphase_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/grpcphase"
	"github.com/atomicphase/atomicphase/grpcphase/internal/paytest"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
	"github.com/atomicphase/atomicphase/protophase"
	"github.com/atomicphase/atomicphase/recovery"
)

func TestMain(m *testing.M) { phasetest.Main(m) }

// env is a payments server on loopback with its database, its client and
// its provider.
type env struct {
	pool     *pgxpool.Pool
	client   *phase.Client
	workflow *phase.Workflow[protophase.Request[*structpb.Struct], paytest.State]
	provider *paytest.Memory
	// raw calls without the client interceptor; conn with it.
	raw, conn *grpc.ClientConn
	// addr is the server's address.
	addr string
	// crashes is the number of injected crashes so far.
	crashes *atomic.Int64
}

type options struct {
	leaseTTL time.Duration
	key      func(*structpb.Struct) string
	pool     *pgxpool.Pool
}

// setup starts a payments server on its own database. A call whose
// metadata has x-crash-at (phase/stage) crashes there, once per key.
func setup(t *testing.T, o options) *env {
	t.Helper()
	ctx := context.Background()
	pool := o.pool
	if pool == nil {
		pool = phasetest.Pool(t)
	}
	if _, err := pool.Exec(ctx, paytest.Schema); err != nil {
		t.Fatal(err)
	}
	e := &env{pool: pool, provider: paytest.NewMemory(), crashes: new(atomic.Int64)}
	var err error
	if e.workflow, err = paytest.Workflow(e.provider); err != nil {
		t.Fatal(err)
	}
	e.client, err = phase.NewClient(pool, &phase.Config{LeaseTTL: o.leaseTTL,
		Logger:    quiet(t),
		Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, e.workflow)
	if err != nil {
		t.Fatal(err)
	}
	s, err := grpcphase.NewServer(e.client, grpcphase.Config{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	if err := grpcphase.Handle[*structpb.Struct, *structpb.Struct](s, paytest.Charge, e.workflow, grpcphase.MethodConfig[*structpb.Struct]{Key: o.key}); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, grpc.ChainUnaryInterceptor(crashOnce(e.crashes), s.UnaryInterceptor()), grpc.StreamInterceptor(s.StreamInterceptor()))
	e.addr = addr
	e.raw = dial(t, addr)
	e.conn = dial(t, addr, grpcphase.ClientConfig{})
	return e
}

// serve serves the payments service on loopback until t ends and returns
// its address.
func serve(t *testing.T, opts ...grpc.ServerOption) string {
	t.Helper()
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&paytest.Service, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// charged checks that the database holds want charge rows, each charged.
func (e *env) charged(t testing.TB, want int) {
	t.Helper()
	if rows, charged, err := paytest.Charges(context.Background(), e.pool); err != nil || rows != want || charged != want {
		t.Errorf("charges: %d rows, %d charged (%v); want %d", rows, charged, err, want)
	}
}

// dial connects to addr, through a client interceptor when cfg is given.
func dial(t testing.TB, addr string, cfg ...grpcphase.ClientConfig) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		// A server restarted by a test is reached again at once.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.2, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: time.Second})}
	if len(cfg) > 0 {
		ic, err := grpcphase.UnaryClientInterceptor(cfg[0])
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, grpc.WithUnaryInterceptor(ic))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// tenant is the test server's Tenant function: the last x-tenant value;
// "down" stands for a user store that is unavailable, "forbidden" for a
// tenant refused with its own status.
func tenant(ctx context.Context) (string, error) {
	t, err := paytest.Tenant(ctx)
	switch t {
	case "down":
		return "", fmt.Errorf("%w: the user store is down", phase.ErrUnavailable)
	case "forbidden":
		return "", status.Error(7, "tenant suspended") // PERMISSION_DENIED
	}
	return t, err
}

// crashOnce injects a crash at the point named by x-crash-at, the first
// time each key reaches it, as a server killed there would stop.
func crashOnce(count *atomic.Int64) grpc.UnaryServerInterceptor {
	var (
		mu      sync.Mutex
		crashed = map[string]bool{}
	)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		at, keys := md.Get("x-crash-at"), md.Get(protophase.DefaultKeyMetadata)
		if len(at) == 1 && len(keys) == 1 {
			p, stage, _ := strings.Cut(at[0], "/")
			ctx = phase.WithInjector(ctx, phase.InjectorFunc(func(ctx context.Context, point phase.Point) error {
				if point != (phase.Point{Phase: p, Stage: phase.Stage(stage)}) {
					return nil
				}
				mu.Lock()
				defer mu.Unlock()
				if crashed[keys[0]] {
					return nil
				}
				crashed[keys[0]] = true
				count.Add(1)
				return phase.ErrCrash
			}))
		}
		return handler(ctx, req)
	}
}

// call sends a Charge on conn as tenant acme under key (none when empty),
// with extra metadata pairs, and returns its answer and header and
// trailer metadata.
func call(ctx context.Context, conn *grpc.ClientConn, key string, req *structpb.Struct, pairs ...string) (*structpb.Struct, metadata.MD, error) {
	pairs = append([]string{paytest.TenantMetadata, "acme"}, pairs...)
	if key != "" {
		pairs = append(pairs, protophase.DefaultKeyMetadata, key)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, pairs...)
	resp := new(structpb.Struct)
	var header, trailer metadata.MD
	err := conn.Invoke(ctx, paytest.Charge, req, resp, grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil {
		return nil, metadata.Join(header, trailer), err
	}
	return resp, header, nil
}

// details returns the ErrorInfo reason and RetryInfo delay of err's status.
func details(err error) (reason string, retry time.Duration) {
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.Reason
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration()
		}
	}
	return reason, retry
}

// effects checks that the provider was called exactly once for each
// downstream key it saw, and returns how many keys it saw.
func (e *env) effects(t testing.TB) int {
	t.Helper()
	calls := e.provider.Calls()
	for k, n := range calls {
		if n != 1 {
			t.Errorf("the provider was called %d times under downstream key %s", n, k)
		}
	}
	return len(calls)
}

// quiet logs errors only, to the test's output.
func quiet(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
}
