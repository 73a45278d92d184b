// Package connectphase serves atomicphase workflows through Connect
// (connectrpc.com/connect) handlers, which also serve gRPC and gRPC-Web:
// an interceptor runs a registered workflow for a procedure under the
// call's Idempotency-Key header, with the contract of package grpcphase
// (protophase.Refuse is the one table of codes both answer with; see
// docs/grpc.md). Connect's HTTP mapping then gives the HTTP contract's
// statuses: ABORTED (in flight) 409, UNAVAILABLE 503, and
// FAILED_PRECONDITION (a reused key) 400, Stripe's answer.
//
//	s, err := connectphase.NewServer(client, connectphase.Config{Tenant: tenantOf})
//	err = connectphase.Handle[*pb.ChargeRequest, pb.ChargeResponse](s, "/pay.Payments/Charge", w, connectphase.MethodConfig[*pb.ChargeRequest]{})
//	path, h := payv1connect.NewPaymentsHandler(impl, connect.WithInterceptors(s.Interceptor()))
//
// Streaming procedures pass through untouched: Interceptor is a unary
// interceptor; do not register them.
package connectphase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/protophase"
)

// Config configures a Server. Zero values mean the documented default.
type Config struct {
	// Tenant returns whose key a call uses, from its authentication,
	// never from its message. Required. A *connect.Error answers as it
	// is; an error wrapping phase.ErrUnavailable answers UNAVAILABLE with
	// a retry delay; any other error answers UNAUTHENTICATED.
	Tenant func(ctx context.Context, header http.Header) (string, error)
	// KeyHeader names the header (gRPC metadata) that carries the
	// idempotency key. Defaults to protophase.DefaultKeyMetadata.
	KeyHeader string
}

// Server runs registered workflows for unary procedures through its
// Interceptor. Register procedures with Handle before serving.
type Server struct {
	client     *phase.Client
	cfg        Config
	procedures map[string]procedure
}

type procedure interface {
	serve(ctx context.Context, s *Server, req connect.AnyRequest) (connect.AnyResponse, error)
}

// NewServer returns a Server that runs workflows with c.
func NewServer(c *phase.Client, cfg Config) (*Server, error) {
	if c == nil {
		return nil, errors.New("connectphase: NewServer needs a *phase.Client")
	}
	if cfg.Tenant == nil {
		return nil, errors.New("connectphase: Config.Tenant is required")
	}
	cfg.KeyHeader = cmp.Or(cfg.KeyHeader, protophase.DefaultKeyMetadata)
	return &Server{client: c, cfg: cfg, procedures: map[string]procedure{}}, nil
}

// MethodConfig configures one procedure. Zero values mean the documented
// default.
type MethodConfig[Req proto.Message] struct {
	// Key, when set, returns the idempotency key the request carries in a
	// field (AIP-155's request_id); see grpcphase.MethodConfig.Key.
	Key func(req Req) string
}

// Handle registers w to serve the unary procedure ("/package.Service/Method")
// whose request message is Req (a pointer, *pb.ChargeRequest) and whose
// response message is Resp (not a pointer, pb.ChargeResponse, as Connect's
// generics have it). The interceptor answers the procedure itself and
// never calls its handler. Call Handle before serving.
func Handle[Req proto.Message, Resp any, State any, PResp interface {
	*Resp
	proto.Message
}](s *Server, proc string, w *phase.Workflow[protophase.Request[Req], State], cfg MethodConfig[Req]) error {
	if _, dup := s.procedures[proc]; dup {
		return fmt.Errorf("connectphase: %s is already handled", proc)
	}
	// A run with an empty tenant checks the registration and then stops
	// at the tenant, before the store.
	if _, err := w.Run(context.Background(), s.client, "", "", protophase.Request[Req]{}); errors.Is(err, phase.ErrNotRegistered) {
		return fmt.Errorf("connectphase: %s: workflow %q: %w", proc, w.Name(), err)
	}
	s.procedures[proc] = &handled[Req, Resp, State, PResp]{w: w, cfg: cfg}
	return nil
}

type handled[Req proto.Message, Resp any, State any, PResp interface {
	*Resp
	proto.Message
}] struct {
	w   *phase.Workflow[protophase.Request[Req], State]
	cfg MethodConfig[Req]
}

// Interceptor returns the interceptor that runs the registered
// procedures' workflows; other calls pass through untouched.
func (s *Server) Interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			p, ok := s.procedures[req.Spec().Procedure]
			if !ok || req.Spec().IsClient {
				return next(ctx, req)
			}
			return p.serve(ctx, s, req)
		}
	})
}

func (h *handled[Req, Resp, State, PResp]) serve(ctx context.Context, s *Server, req connect.AnyRequest) (connect.AnyResponse, error) {
	proc := req.Spec().Procedure
	msg, ok := req.Any().(Req)
	if !ok {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("%s: the request is a %T, not the message the workflow was registered with", proc, req.Any()))
	}
	var field string
	if h.cfg.Key != nil {
		field = h.cfg.Key(msg)
	}
	key, refused := protophase.KeyFrom(http.CanonicalHeaderKey(s.cfg.KeyHeader)+" header", req.Header().Values(s.cfg.KeyHeader), field)
	if refused != nil {
		return nil, errorOf(refused.Status())
	}
	tenant, err := s.cfg.Tenant(ctx, req.Header())
	if err != nil {
		var ce *connect.Error
		switch {
		case errors.As(err, &ce):
			return nil, ce
		case errors.Is(err, phase.ErrUnavailable):
			return nil, errorOf(protophase.Refuse(nil, err).Status())
		}
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	out, err := h.w.Run(context.WithoutCancel(ctx), s.client, tenant, key, protophase.Request[Req]{Method: proc, Message: msg})
	if err != nil || out.Response == nil {
		return nil, errorOf(protophase.Refuse(out, err).Status())
	}
	m, st, err := protophase.Answer[PResp](out.Response)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	// Every answer carries the mark, true or false: a client that saw it
	// knows the call ran (see grpcphase).
	mark := strconv.FormatBool(out.Kind == phase.OutcomeReplayed)
	if st != nil {
		ce := errorOf(st)
		ce.Meta().Set(protophase.ReplayedMetadata, mark)
		return nil, ce
	}
	resp := connect.NewResponse((*Resp)(m))
	resp.Header().Set(protophase.ReplayedMetadata, mark)
	return resp, nil
}

// errorOf is the Connect error of a google.rpc.Status, its details
// included.
func errorOf(st *spb.Status) *connect.Error {
	ce := connect.NewError(connect.Code(st.GetCode()), errors.New(st.GetMessage()))
	for _, a := range st.GetDetails() {
		m, err := a.UnmarshalNew()
		if err != nil {
			continue
		}
		if d, err := connect.NewErrorDetail(m); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}
