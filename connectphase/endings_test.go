package connectphase_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/connectphase"
	"github.com/atomicphase/atomicphase/protophase"
)

// wire serves procedure with a Connect handler behind a script that ends
// each attempt the way a network may: the connection lost before any
// byte, after the header, in the middle of the message. The last step
// repeats.
type wire struct {
	mu      sync.Mutex
	script  []ending
	keys    []string
	handler http.Handler
}

// ending is what the server does with one attempt; h answers it as the
// handler does.
type ending func(w http.ResponseWriter, r *http.Request, conn net.Conn, h http.Handler)

type connKey struct{}

func (s *wire) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	step := s.script[min(len(s.keys), len(s.script)-1)]
	s.keys = append(s.keys, r.Header.Get(protophase.DefaultKeyMetadata))
	s.mu.Unlock()
	step(w, r, r.Context().Value(connKey{}).(net.Conn), s.handler)
}

func (s *wire) attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// the refusal header tells the handler which status to answer.
const refusalHeader = "x-refuse"

func newWire(script ...ending) *wire {
	h := connect.NewUnaryHandler(procedure, func(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		if r := req.Header().Get(refusalHeader); r != "" {
			c, delay, _ := strings.Cut(r, ",")
			n, _ := strconv.Atoi(c)
			ce := connect.NewError(connect.Code(n), errors.New("refused"))
			ce.Meta().Set(protophase.ReplayedMetadata, "false")
			if d, _ := time.ParseDuration(delay); d > 0 {
				detail, _ := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
				ce.AddDetail(detail)
			}
			if req.Header().Get("x-no-header") != "" {
				ce.Meta().Del(protophase.ReplayedMetadata)
			}
			return nil, ce
		}
		msg, _ := structpb.NewStruct(map[string]any{"charge_id": "ch_1"})
		resp := connect.NewResponse(msg)
		resp.Header().Set(protophase.ReplayedMetadata, "false")
		return resp, nil
	})
	return &wire{script: script, handler: h}
}

func answer(w http.ResponseWriter, r *http.Request, _ net.Conn, h http.Handler) { h.ServeHTTP(w, r) }

func refuse(c connect.Code, retry time.Duration, withHeader bool) ending {
	return func(w http.ResponseWriter, r *http.Request, _ net.Conn, h http.Handler) {
		r.Header.Set(refusalHeader, strconv.Itoa(int(c))+","+retry.String())
		if !withHeader {
			r.Header.Set("x-no-header", "1")
		}
		h.ServeHTTP(w, r)
	}
}

func dropBeforeAnyByte(_ http.ResponseWriter, _ *http.Request, conn net.Conn, _ http.Handler) {
	_ = conn.Close()
}

func dropAfterHeader(replayed string) ending {
	return func(w http.ResponseWriter, r *http.Request, conn net.Conn, _ http.Handler) {
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		w.Header().Set(protophase.ReplayedMetadata, replayed)
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond)
		_ = conn.Close()
	}
}

func dropMidMessage(w http.ResponseWriter, r *http.Request, conn net.Conn, _ http.Handler) {
	msg, _ := structpb.NewStruct(map[string]any{"charge_id": "ch_1"})
	body, _ := proto.Marshal(msg)
	w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
	w.Header().Set(protophase.ReplayedMetadata, "false")
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
		body = append([]byte{0, 0, 0, 0, byte(len(body))}, body...)
	} else {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body[:len(body)/2])
	w.(http.Flusher).Flush()
	time.Sleep(20 * time.Millisecond)
	_ = conn.Close()
}

func slow(d time.Duration) ending {
	return func(w http.ResponseWriter, r *http.Request, conn net.Conn, h http.Handler) {
		time.Sleep(d)
		h.ServeHTTP(w, r)
	}
}

// protocols are the ways a Connect client reaches a server: the Connect
// protocol over HTTP/1.1 and over HTTP/2, and the gRPC protocol.
var protocols = []struct {
	name  string
	grpc  bool
	http2 bool
}{{"connect over HTTP/1.1", false, false}, {"connect over HTTP/2", false, true}, {"gRPC", true, true}}

func startWire(t *testing.T, s *wire, grpc, http2 bool, cfg connectphase.ClientConfig, opts ...connect.ClientOption) *connect.Client[structpb.Struct, structpb.Struct] {
	t.Helper()
	srv := &http.Server{Handler: s, Protocols: new(http.Protocols),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) }}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	transport := &http.Transport{Protocols: new(http.Protocols), TLSClientConfig: &tls.Config{}}
	if http2 {
		transport.Protocols.SetUnencryptedHTTP2(true)
	} else {
		transport.Protocols.SetHTTP1(true)
	}
	t.Cleanup(transport.CloseIdleConnections)
	ic, err := connectphase.ClientInterceptor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	opts = append(opts, connect.WithInterceptors(ic))
	if grpc {
		opts = append(opts, connect.WithGRPC())
	}
	return connect.NewClient[structpb.Struct, structpb.Struct](&http.Client{Transport: transport}, "http://"+lis.Addr().String()+procedure, opts...)
}

var errAny = errors.New("any cause")

// TestEveryEndingOfAConnectCallIsTheAnswerARefusalOrAnUnknownOutcomeWithTheKey
// drives the Connect client interceptor, over each protocol, through every
// way an attempt ends: a call that may have run never ends with a plain
// error, and every attempt carries the first one's key.
func TestEveryEndingOfAConnectCallIsTheAnswerARefusalOrAnUnknownOutcomeWithTheKey(t *testing.T) {
	t.Parallel()
	fast := connectphase.ClientConfig{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
	type want struct {
		code     connect.Code // 0: OK
		unknown  error
		attempts int
	}
	for _, p := range protocols {
		for _, tc := range []struct {
			name    string
			cfg     connectphase.ClientConfig
			ctx     func() (context.Context, context.CancelFunc)
			readMax int
			script  []ending
			want    want
		}{
			{name: "answer", script: []ending{answer}, want: want{0, nil, 1}},
			{name: "connection lost before any byte", script: []ending{dropBeforeAnyByte, answer}, want: want{0, nil, 2}},
			{name: "connection lost after the header", script: []ending{dropAfterHeader("false"), answer}, want: want{0, nil, 2}},
			{name: "connection lost after a header marked replayed", script: []ending{dropAfterHeader("true"), answer}, want: want{0, nil, 2}},
			{name: "connection lost in the middle of the message", script: []ending{dropMidMessage, answer}, want: want{0, nil, 2}},
			{name: "store down, then back", script: []ending{refuse(connect.CodeUnavailable, 20*time.Millisecond, false), answer}, want: want{0, nil, 2}},
			{name: "server draining, then another answers", script: []ending{refuse(connect.CodeUnavailable, 0, true), answer}, want: want{0, nil, 2}},
			{name: "store down throughout", cfg: connectphase.ClientConfig{MaxAttempts: 3, BaseDelay: time.Millisecond},
				script: []ending{refuse(connect.CodeUnavailable, 10*time.Millisecond, false)}, want: want{connect.CodeUnavailable, protophase.ErrBudgetExhausted, 3}},
			{name: "connection lost on every attempt", cfg: connectphase.ClientConfig{MaxAttempts: 3, BaseDelay: time.Millisecond},
				script: []ending{dropAfterHeader("true")}, want: want{0, protophase.ErrBudgetExhausted, 3}},
			{name: "deadline during an attempt", script: []ending{slow(2 * time.Second)},
				ctx: func() (context.Context, context.CancelFunc) {
					return context.WithTimeout(context.Background(), 300*time.Millisecond)
				}, want: want{connect.CodeDeadlineExceeded, context.DeadlineExceeded, 1}},
			{name: "cancel during an attempt", script: []ending{slow(2 * time.Second)},
				ctx: func() (context.Context, context.CancelFunc) {
					ctx, cancel := context.WithCancel(context.Background())
					time.AfterFunc(300*time.Millisecond, cancel)
					return ctx, cancel
				}, want: want{connect.CodeCanceled, context.Canceled, 1}},
			{name: "budget during an attempt", cfg: connectphase.ClientConfig{MaxElapsed: 300 * time.Millisecond},
				script: []ending{slow(2 * time.Second)}, want: want{connect.CodeDeadlineExceeded, protophase.ErrBudgetExhausted, 1}},
			{name: "context ended before the call", script: []ending{answer},
				ctx: func() (context.Context, context.CancelFunc) {
					ctx, cancel := context.WithCancel(context.Background())
					cancel()
					return ctx, cancel
				}, want: want{connect.CodeCanceled, nil, 0}},
			{name: "message too large, refused before the server ran", script: []ending{refuse(connect.CodeResourceExhausted, 0, false), answer},
				want: want{connect.CodeResourceExhausted, nil, 1}},
			{name: "reply too large to read", readMax: 8, script: []ending{answer},
				want: want{connect.CodeResourceExhausted, errAny, 1}},
			{name: "a final refusal", script: []ending{refuse(connect.CodeFailedPrecondition, 0, false), answer}, want: want{connect.CodeFailedPrecondition, nil, 1}},
		} {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				cfg := tc.cfg
				if cfg.MaxAttempts == 0 && cfg.MaxElapsed == 0 {
					cfg = fast
				}
				s := newWire(tc.script...)
				var opts []connect.ClientOption
				if tc.readMax > 0 {
					opts = append(opts, connect.WithReadMaxBytes(tc.readMax))
				}
				c := startWire(t, s, p.grpc, p.http2, cfg, opts...)
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if tc.ctx != nil {
					ctx, cancel = tc.ctx()
				}
				defer cancel()
				_, err := c.CallUnary(ctx, connect.NewRequest(new(structpb.Struct)))
				var got connect.Code
				if err != nil {
					got = connect.CodeOf(err)
				}
				if tc.want.code != 0 && got != tc.want.code || tc.want.code == 0 && tc.want.unknown == nil && err != nil {
					t.Errorf("code %v (%v); want %v", got, err, tc.want.code)
				}
				if n := s.attempts(); n != tc.want.attempts {
					t.Errorf("%d attempts reached the server; want %d", n, tc.want.attempts)
				}
				var unknown *connectphase.UnknownOutcomeError
				switch {
				case tc.want.unknown == nil && errors.As(err, &unknown):
					t.Errorf("%v; want no unknown outcome", err)
				case tc.want.unknown != nil && !errors.As(err, &unknown):
					t.Errorf("%v (%T); want an *UnknownOutcomeError with the key", err, err)
				case tc.want.unknown != nil && tc.want.unknown != errAny && !errors.Is(unknown.Cause, tc.want.unknown):
					t.Errorf("unknown outcome caused by %v; want %v", unknown.Cause, tc.want.unknown)
				}
				s.mu.Lock()
				defer s.mu.Unlock()
				for _, k := range s.keys {
					if k == "" || k != s.keys[0] {
						t.Fatalf("keys sent %q; want one key on every attempt", s.keys)
					}
				}
				if unknown != nil && (len(s.keys) == 0 || unknown.Key != s.keys[0]) {
					t.Errorf("the unknown outcome names key %q; the attempts carried %q", unknown.Key, s.keys)
				}
			})
		}
	}
}
