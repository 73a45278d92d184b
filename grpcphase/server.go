package grpcphase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/protophase"
)

// Config configures a Server. Zero values mean the documented default.
type Config struct {
	// Tenant returns whose key a call uses, from its authentication (the
	// peer's certificate, a token in the metadata), never from its message.
	// Required. An error carrying a gRPC status answers that status; an
	// error wrapping phase.ErrUnavailable (the user store is down, say)
	// answers UNAVAILABLE with a retry delay, as an outage of the key
	// store does; any other error answers UNAUTHENTICATED.
	Tenant func(ctx context.Context) (string, error)
	// KeyMetadata names the metadata that carries the idempotency key.
	// Defaults to protophase.DefaultKeyMetadata, "idempotency-key".
	KeyMetadata string
}

// Server runs registered workflows for unary methods, through the
// interceptors it returns. Register methods with Handle before serving.
type Server struct {
	client  *phase.Client
	cfg     Config
	methods map[string]method
}

// method is a registered method, its types bound.
type method interface {
	serve(ctx context.Context, s *Server, fullMethod string, req any) (any, error)
}

// NewServer returns a Server that runs workflows with c.
func NewServer(c *phase.Client, cfg Config) (*Server, error) {
	if c == nil {
		return nil, errors.New("grpcphase: NewServer needs a *phase.Client")
	}
	if cfg.Tenant == nil {
		return nil, errors.New("grpcphase: Config.Tenant is required")
	}
	cfg.KeyMetadata = strings.ToLower(cmp.Or(cfg.KeyMetadata, protophase.DefaultKeyMetadata))
	return &Server{client: c, cfg: cfg, methods: map[string]method{}}, nil
}

// MethodConfig configures one method. Zero values mean the documented
// default.
type MethodConfig[Req proto.Message] struct {
	// Key, when set, returns the idempotency key the request message
	// carries in a field, as Google's AIP-155 (request_id) and AEP-155
	// (idempotency_key) put it. A call may then omit the key metadata; when
	// it sends both, they must be equal. An empty field counts as missing.
	// Defaults to reading the key from the metadata only.
	Key func(req Req) string
}

// Handle registers w to serve the unary method fullMethod
// ("/package.Service/Method"), whose request message is Req and response
// message Resp. w must be registered with s's client. The interceptor then
// answers the method itself, and never calls the method's own handler:
// implement it as returning codes.Unimplemented. Call Handle before the
// server serves.
func Handle[Req, Resp proto.Message, State any](s *Server, fullMethod string, w *phase.Workflow[protophase.Request[Req], State], cfg MethodConfig[Req]) error {
	if !strings.HasPrefix(fullMethod, "/") || strings.Count(fullMethod, "/") != 2 {
		return fmt.Errorf("grpcphase: %q is not a full method name such as /package.Service/Method", fullMethod)
	}
	if _, dup := s.methods[fullMethod]; dup {
		return fmt.Errorf("grpcphase: %s is already handled", fullMethod)
	}
	// A run with an empty tenant checks the registration and then stops
	// at the tenant, before the store.
	if _, err := w.Run(context.Background(), s.client, "", "", protophase.Request[Req]{}); errors.Is(err, phase.ErrNotRegistered) {
		return fmt.Errorf("grpcphase: %s: workflow %q: %w", fullMethod, w.Name(), err)
	}
	s.methods[fullMethod] = &handled[Req, Resp, State]{w: w, cfg: cfg}
	return nil
}

type handled[Req, Resp proto.Message, State any] struct {
	w   *phase.Workflow[protophase.Request[Req], State]
	cfg MethodConfig[Req]
}

// UnaryInterceptor returns the interceptor that runs the registered
// methods' workflows; calls to other methods pass through untouched.
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m, ok := s.methods[info.FullMethod]
		if !ok {
			return handler(ctx, req)
		}
		return m.serve(ctx, s, info.FullMethod, req)
	}
}

// StreamInterceptor returns the interceptor that refuses, with
// UNIMPLEMENTED, a streaming call to a registered method or one that
// carries an idempotency key: a stream's messages are not run under keys,
// and a client that sends a key expects a guarantee no stream gets.
// Other streams pass through untouched.
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		if _, ok := s.methods[info.FullMethod]; ok || len(md.Get(s.cfg.KeyMetadata)) > 0 {
			return status.Errorf(codes.Unimplemented, "%s: streaming calls are not run under idempotency keys; only unary methods are", info.FullMethod)
		}
		return handler(srv, ss)
	}
}

func (h *handled[Req, Resp, State]) serve(ctx context.Context, s *Server, fullMethod string, req any) (any, error) {
	msg, ok := req.(Req)
	if !ok {
		return nil, status.Errorf(codes.Internal, "%s: the request is a %T, not the message the workflow was registered with", fullMethod, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var field string
	if h.cfg.Key != nil {
		if err := recovered(func() { field = h.cfg.Key(msg) }); err != nil {
			return nil, err
		}
	}
	key, refused := protophase.KeyFrom(s.cfg.KeyMetadata+" metadata", md.Get(s.cfg.KeyMetadata), field)
	if refused != nil {
		return nil, statusOf(*refused)
	}
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	// Once the key is taken the run goes on if the client hangs up: its
	// retry then finds a stored answer instead of a half-done key.
	out, err := h.w.Run(context.WithoutCancel(ctx), s.client, tenant, key, protophase.Request[Req]{Method: fullMethod, Message: msg})
	if err != nil || out.Response == nil {
		return nil, statusOf(protophase.Refuse(out, err))
	}
	resp, st, err := protophase.Answer[Resp](out.Response)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: %v", fullMethod, err)
	}
	// Every answer carries the mark, true or false, in its header
	// metadata: a client that saw it knows the call ran, so that a reply
	// too large for it to read is an unknown outcome, not a refusal.
	if out.Kind == phase.OutcomeReplayed {
		_ = grpc.SetHeader(ctx, replayed)
	} else {
		_ = grpc.SetHeader(ctx, fresh)
	}
	if st != nil {
		if out.Kind == phase.OutcomeReplayed {
			// An error status goes out without headers when none were
			// sent (trailers-only): the trailer carries the mark too.
			_ = grpc.SetTrailer(ctx, replayed)
		}
		return nil, status.ErrorProto(st)
	}
	return resp, nil
}

// replayed marks an answer replayed from the key's stored one.
var replayed = metadata.Pairs(protophase.ReplayedMetadata, "true")

// fresh marks an answer the call's own run made.
var fresh = metadata.Pairs(protophase.ReplayedMetadata, "false")

// tenant finds whose key the call uses, answering the Tenant function's
// error as Config.Tenant says.
func (s *Server) tenant(ctx context.Context) (string, error) {
	var (
		tenant string
		err    error
	)
	if perr := recovered(func() { tenant, err = s.cfg.Tenant(ctx) }); perr != nil {
		return "", perr
	}
	if err == nil {
		return tenant, nil
	}
	if st, ok := status.FromError(err); ok {
		return "", st.Err()
	}
	if errors.Is(err, phase.ErrUnavailable) {
		return "", statusOf(protophase.Refuse(nil, err))
	}
	return "", status.Error(codes.Unauthenticated, err.Error())
}

// recovered runs f, turning a panic in user code into INTERNAL: a bug in
// one call's Tenant or Key function must not take the server down.
func recovered(f func()) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = status.Errorf(codes.Internal, "the call could not be read because of a server bug: %v", v)
		}
	}()
	f()
	return nil
}

// statusOf is the gRPC error of a refusal, with its details.
func statusOf(r protophase.Refusal) error {
	return status.ErrorProto(r.Status())
}
