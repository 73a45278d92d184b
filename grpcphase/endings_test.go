package grpcphase_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/grpcphase"
	"github.com/atomicphase/atomicphase/protophase"
)

// wire is a gRPC server written on HTTP/2 by hand, so that an attempt can
// end the ways a real network ends it: the connection lost before any
// byte, after the header, in the middle of the message. Each attempt does
// what the script says, the last step repeating.
type wire struct {
	mu     sync.Mutex
	script []ending
	keys   []string
}

// ending is what the server does with one attempt.
type ending func(w http.ResponseWriter, conn net.Conn)

func (s *wire) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	step := s.script[min(len(s.keys), len(s.script)-1)]
	s.keys = append(s.keys, r.Header.Get(protophase.DefaultKeyMetadata))
	s.mu.Unlock()
	step(w, r.Context().Value(connKey{}).(net.Conn))
}

func (s *wire) attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

type connKey struct{}

// startWire serves script on loopback over HTTP/2 without TLS and returns
// a connection to it through the client interceptor.
func startWire(t *testing.T, cfg grpcphase.ClientConfig, script ...ending) (*wire, *grpc.ClientConn) {
	t.Helper()
	s := &wire{script: script}
	srv := &http.Server{Handler: s, Protocols: new(http.Protocols),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) }}
	srv.Protocols.SetUnencryptedHTTP2(true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	ic, err := grpcphase.UnaryClientInterceptor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(ic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return s, conn
}

func header(w http.ResponseWriter, replayed string) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Trailer", "Grpc-Status, Grpc-Message, Grpc-Status-Details-Bin")
	if replayed != "" {
		w.Header().Set(protophase.ReplayedMetadata, replayed)
	}
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
}

// frame is the five-byte prefix of a message: not compressed, its length.
func frame(m proto.Message) []byte {
	return binary.BigEndian.AppendUint32([]byte{0}, uint32(proto.Size(m)))
}

func encodeBin(b []byte) string { return base64.RawStdEncoding.EncodeToString(b) }

// answer answers the message {"charge_id": "ch_1"}, fresh.
func answer(w http.ResponseWriter, _ net.Conn) {
	msg, _ := structpb.NewStruct(map[string]any{"charge_id": "ch_1"})
	body, _ := proto.Marshal(msg)
	header(w, "false")
	_, _ = w.Write(append(frame(msg), body...))
	w.Header().Set("Grpc-Status", "0")
}

// refuse answers an error status with a RetryInfo delay when retry > 0,
// its header sent first when withHeader.
func refuse(c codes.Code, retry time.Duration, withHeader bool) ending {
	return func(w http.ResponseWriter, _ net.Conn) {
		st := status.New(c, c.String())
		if retry > 0 {
			st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
		}
		details, _ := proto.Marshal(st.Proto())
		if withHeader {
			header(w, "false")
			w.Header().Set("Grpc-Status", strconv.Itoa(int(c)))
			w.Header().Set("Grpc-Status-Details-Bin", encodeBin(details))
			return
		}
		// Trailers-only: the status travels in the only header block.
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Grpc-Status", strconv.Itoa(int(c)))
		w.Header().Set("Grpc-Status-Details-Bin", encodeBin(details))
		w.WriteHeader(http.StatusOK)
	}
}

// dropAfterHeader sends the header, marked replayed or not, then loses the
// connection.
func dropAfterHeader(replayed string) ending {
	return func(w http.ResponseWriter, conn net.Conn) {
		header(w, replayed)
		time.Sleep(20 * time.Millisecond)
		_ = conn.Close()
	}
}

// dropBeforeAnyByte loses the connection before answering anything.
func dropBeforeAnyByte(_ http.ResponseWriter, conn net.Conn) { _ = conn.Close() }

// dropMidMessage sends the header and half of the message, then loses the
// connection.
func dropMidMessage(w http.ResponseWriter, conn net.Conn) {
	msg, _ := structpb.NewStruct(map[string]any{"charge_id": "ch_1"})
	body, _ := proto.Marshal(msg)
	header(w, "false")
	_, _ = w.Write(append(frame(msg), body[:len(body)/2]...))
	w.(http.Flusher).Flush()
	time.Sleep(20 * time.Millisecond)
	_ = conn.Close()
}

// slow answers after d, or never when the client leaves first.
func slow(d time.Duration) ending {
	return func(w http.ResponseWriter, conn net.Conn) {
		time.Sleep(d)
		answer(w, conn)
	}
}

// TestEveryEndingOfAGRPCCallIsTheAnswerARefusalOrAnUnknownOutcomeWithTheKey
// drives the client interceptor through every way an attempt ends: a
// call that may have run never ends with a plain error, and a retry always
// carries the first attempt's key.
func TestEveryEndingOfAGRPCCallIsTheAnswerARefusalOrAnUnknownOutcomeWithTheKey(t *testing.T) {
	t.Parallel()
	fast := grpcphase.ClientConfig{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
	type want struct {
		code     codes.Code
		unknown  error // the cause of the unknown outcome; nil: none
		attempts int
	}
	for _, tc := range []struct {
		name    string
		cfg     grpcphase.ClientConfig
		ctx     func() (context.Context, context.CancelFunc)
		recvMax int
		script  []ending
		want    want
	}{
		{name: "answer", script: []ending{answer}, want: want{codes.OK, nil, 1}},
		{name: "connection lost before any byte", script: []ending{dropBeforeAnyByte, answer}, want: want{codes.OK, nil, 2}},
		{name: "connection lost after the header", script: []ending{dropAfterHeader("false"), answer}, want: want{codes.OK, nil, 2}},
		{name: "connection lost after a header marked replayed", script: []ending{dropAfterHeader("true"), answer}, want: want{codes.OK, nil, 2}},
		{name: "connection lost in the middle of the message", script: []ending{dropMidMessage, answer}, want: want{codes.OK, nil, 2}},
		{name: "store down, then back", script: []ending{refuse(codes.Unavailable, 20*time.Millisecond, false), answer}, want: want{codes.OK, nil, 2}},
		{name: "server draining, then another answers", script: []ending{refuse(codes.Unavailable, 0, true), answer}, want: want{codes.OK, nil, 2}},
		{name: "store down throughout", cfg: grpcphase.ClientConfig{MaxAttempts: 3, BaseDelay: time.Millisecond},
			script: []ending{refuse(codes.Unavailable, 10*time.Millisecond, false)}, want: want{codes.Unavailable, grpcphase.ErrBudgetExhausted, 3}},
		{name: "connection lost on every attempt", cfg: grpcphase.ClientConfig{MaxAttempts: 3, BaseDelay: time.Millisecond},
			script: []ending{dropAfterHeader("true")}, want: want{codes.Unavailable, grpcphase.ErrBudgetExhausted, 3}},
		{name: "deadline during an attempt", script: []ending{slow(2 * time.Second)},
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 300*time.Millisecond)
			}, want: want{codes.DeadlineExceeded, context.DeadlineExceeded, 1}},
		{name: "cancel during an attempt", script: []ending{slow(2 * time.Second)},
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(300*time.Millisecond, cancel)
				return ctx, cancel
			}, want: want{codes.Canceled, context.Canceled, 1}},
		{name: "budget during an attempt", cfg: grpcphase.ClientConfig{MaxElapsed: 300 * time.Millisecond},
			script: []ending{slow(2 * time.Second)}, want: want{codes.DeadlineExceeded, grpcphase.ErrBudgetExhausted, 1}},
		{name: "deadline during the pause after a lost connection", script: []ending{dropBeforeAnyByte, refuse(codes.Aborted, 5*time.Second, false)},
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Second)
			}, want: want{codes.Aborted, context.DeadlineExceeded, 2}},
		{name: "context ended before the call", script: []ending{answer},
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			}, want: want{codes.Canceled, nil, 0}},
		{name: "message too large, refused before the server ran", script: []ending{refuse(codes.ResourceExhausted, 0, false), answer},
			want: want{codes.ResourceExhausted, nil, 1}},
		{name: "reply too large to read", recvMax: 8, script: []ending{answer},
			want: want{codes.ResourceExhausted, errAny, 1}},
		{name: "rate limited, then answered", script: []ending{refuse(codes.ResourceExhausted, 20*time.Millisecond, false), answer},
			want: want{codes.OK, nil, 2}},
		{name: "a final refusal", script: []ending{refuse(codes.FailedPrecondition, 0, false), answer}, want: want{codes.FailedPrecondition, nil, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg
			if cfg.MaxAttempts == 0 && cfg.MaxElapsed == 0 {
				cfg = fast
			}
			s, conn := startWire(t, cfg, tc.script...)
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			var opts []grpc.CallOption
			if tc.recvMax > 0 {
				opts = append(opts, grpc.MaxCallRecvMsgSize(tc.recvMax))
			}
			err := conn.Invoke(ctx, "/pay.Payments/Charge", new(structpb.Struct), new(structpb.Struct), opts...)
			if got := status.Code(err); got != tc.want.code {
				t.Errorf("code %v (%v); want %v", got, err, tc.want.code)
			}
			if n := s.attempts(); n != tc.want.attempts {
				t.Errorf("%d attempts reached the server; want %d", n, tc.want.attempts)
			}
			var unknown *grpcphase.UnknownOutcomeError
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

// errAny stands for any cause of an unknown outcome.
var errAny = errors.New("any cause")

// TestTheClientSendsTheRequestFieldsKeyInTheMetadata is the example of
// docs/grpc.md: a server that reads the key from request_id, a client
// interceptor with its defaults, and a call that sets request_id and no
// metadata. The call runs once under request_id, and its retry is replayed.
func TestTheClientSendsTheRequestFieldsKeyInTheMetadata(t *testing.T) {
	t.Parallel()
	s, conn := startWire(t, grpcphase.ClientConfig{}, answer)
	msg := &errdetails.RequestInfo{RequestId: "req-42"}
	if err := conn.Invoke(context.Background(), "/pay.Payments/Charge", msg, new(structpb.Struct)); err != nil {
		t.Fatal(err)
	}
	if s.keys[0] != "req-42" {
		t.Errorf("key sent %q; want the request_id field's req-42", s.keys[0])
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), protophase.DefaultKeyMetadata, "mine")
	if err := conn.Invoke(ctx, "/pay.Payments/Charge", msg, new(structpb.Struct)); err != nil {
		t.Fatal(err)
	}
	if s.keys[1] != "mine" {
		t.Errorf("key sent %q; want the metadata's own key", s.keys[1])
	}
}
