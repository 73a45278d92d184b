// Package paytest is the payments service the module's tests and their
// server binary share: a hand-written service description over
// well-known message types (structpb.Struct), so that no protoc is needed,
// a charge workflow, and fake card providers that count every call.
package paytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/protophase"
)

// The service's methods.
const (
	Charge = "/paytest.Payments/Charge"
	Ping   = "/paytest.Payments/Ping"
	Watch  = "/paytest.Payments/Watch"
)

// DeclineAbove is the largest amount the workflow charges; a larger one is
// declined with a stored FAILED_PRECONDITION.
const DeclineAbove = 10000

// TenantMetadata carries the tenant in the tests (a real service takes it
// from the call's authentication).
const TenantMetadata = "x-tenant"

// Tenant reads the tenant from TenantMetadata, its last value.
func Tenant(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(TenantMetadata); len(v) > 0 && v[len(v)-1] != "" {
		return v[len(v)-1], nil
	}
	return "", errors.New("no tenant")
}

// Service is the payments service description. Charge is answered by the
// interceptor; Ping echoes its request; Watch streams nothing.
var Service = grpc.ServiceDesc{
	ServiceName: "paytest.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Charge", Handler: unary(Charge, func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
			return nil, status.Error(codes.Unimplemented, "Charge is served by its workflow")
		})},
		{MethodName: "Ping", Handler: unary(Ping, func(_ context.Context, in *structpb.Struct) (*structpb.Struct, error) { return in, nil })},
	},
	Streams: []grpc.StreamDesc{{StreamName: "Watch", ServerStreams: true, Handler: func(any, grpc.ServerStream) error { return nil }}},
}

// unary is the handler generated code would have for a unary method.
func unary(fullMethod string, f func(context.Context, *structpb.Struct) (*structpb.Struct, error)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := new(structpb.Struct)
		if err := dec(in); err != nil {
			return nil, err
		}
		handler := func(ctx context.Context, req any) (any, error) { return f(ctx, req.(*structpb.Struct)) }
		if interceptor == nil {
			return handler(ctx, in)
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: fullMethod}, handler)
	}
}

// Provider is a card provider: Charge makes a charge under a downstream
// idempotency key, Lookup finds the charge made under one.
type Provider interface {
	Charge(ctx context.Context, key string, amount int64) (string, error)
	Lookup(ctx context.Context, key string) (id string, found bool, err error)
}

// Request is the Charge message of amount, with requestID in its
// request_id field when set.
func Request(amount int64, requestID string) *structpb.Struct {
	fields := map[string]any{"amount": float64(amount)}
	if requestID != "" {
		fields["request_id"] = requestID
	}
	s, _ := structpb.NewStruct(fields)
	return s
}

// RequestID is the AIP-155 accessor of the Charge message.
func RequestID(req *structpb.Struct) string { return req.GetFields()["request_id"].GetStringValue() }

// In is what the workflow's phases get.
type In = phase.Input[protophase.Request[*structpb.Struct], State]

// State is the workflow's state.
type State struct {
	ChargeID string `json:"charge_id"`
}

// Schema creates the table the workflow writes.
const Schema = `CREATE TABLE IF NOT EXISTS charges (key_id uuid PRIMARY KEY, amount bigint NOT NULL, charge_id text)`

// Workflow is the charge workflow: reserved (declines amounts above
// DeclineAbove with a stored FAILED_PRECONDITION, else inserts the charge
// row), charged (one call to p, reconciled by its Lookup when its outcome
// is unknown, so the provider sees one call per key even though it
// honours no key), answered (replies with the charge).
func Workflow(p Provider) (*phase.Workflow[protophase.Request[*structpb.Struct], State], error) {
	charged := phase.Reconciled(
		phase.Foreign("charged",
			func(ctx context.Context, in *In) (string, error) {
				return p.Charge(ctx, in.DownstreamKey(), amountOf(in))
			}, record),
		func(ctx context.Context, in *In) (string, phase.Verdict, error) {
			id, found, err := p.Lookup(ctx, in.DownstreamKey())
			switch {
			case err != nil:
				return "", phase.Pending, err
			case found:
				return id, phase.Happened, nil
			}
			return "", phase.NotHappened, nil
		}, record)
	return phase.NewWorkflow("charge",
		phase.Local("reserved", func(ctx context.Context, tx pgx.Tx, in *In) (phase.Result, error) {
			amount := amountOf(in)
			if amount > DeclineAbove {
				return protophase.Fail(code.Code_FAILED_PRECONDITION, "card declined",
					&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "paytest"}), nil
			}
			_, err := tx.Exec(ctx, `INSERT INTO charges (key_id, amount) VALUES ($1, $2)`, in.ID, amount)
			return phase.Next(), err
		}),
		charged,
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, in *In) (phase.Result, error) {
			s, err := structpb.NewStruct(map[string]any{"charge_id": in.State.ChargeID, "amount": float64(amountOf(in))})
			if err != nil {
				return phase.Result{}, err
			}
			return protophase.Reply(s), nil
		}))
}

func record(ctx context.Context, tx pgx.Tx, in *In, id string) (phase.Result, error) {
	in.State.ChargeID = id
	_, err := tx.Exec(ctx, `UPDATE charges SET charge_id = $2 WHERE key_id = $1`, in.ID, id)
	return phase.Next(), err
}

func amountOf(in *In) int64 {
	return int64(in.Req.Message.GetFields()["amount"].GetNumberValue())
}

// Charges counts the charge rows, and those with a charge id.
func Charges(ctx context.Context, pool *pgxpool.Pool) (rows, charged int, err error) {
	err = pool.QueryRow(ctx, `SELECT count(*), count(charge_id) FROM charges`).Scan(&rows, &charged)
	return rows, charged, err
}

// Memory is an in-process provider that honours no key: every call is a
// charge. It counts calls by downstream key.
type Memory struct {
	mu      sync.Mutex
	calls   map[string]int
	charges map[string]string
	// Before, when set, runs at the start of every call.
	Before func(ctx context.Context, key string, amount int64) error
}

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{calls: map[string]int{}, charges: map[string]string{}} }

// Charge implements Provider.
func (m *Memory) Charge(ctx context.Context, key string, amount int64) (string, error) {
	if m.Before != nil {
		if err := m.Before(ctx, key, amount); err != nil {
			return "", err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[key]++
	id := fmt.Sprintf("ch_%d_%s", m.calls[key], key)
	m.charges[key] = id
	return id, nil
}

// Lookup implements Provider.
func (m *Memory) Lookup(_ context.Context, key string) (string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.charges[key]
	return id, ok, nil
}

// Calls returns the calls made, by downstream key.
func (m *Memory) Calls() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.calls)
}

// Handler serves m over HTTP for a server in another process: POST
// /charges?amount=N with the downstream key in Idempotency-Key, GET
// /charges/<key>.
func (m *Memory) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		amount, _ := strconv.ParseInt(r.URL.Query().Get("amount"), 10, 64)
		id, err := m.Charge(r.Context(), r.Header.Get("Idempotency-Key"), amount)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"id": id})
	})
	mux.HandleFunc("GET /charges/{key}", func(w http.ResponseWriter, r *http.Request) {
		id, ok, _ := m.Lookup(r.Context(), r.PathValue("key"))
		if !ok {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"id": id})
	})
	return mux
}

// HTTP is the Provider that Memory.Handler serves, at URL.
type HTTP struct {
	URL    string
	Client *http.Client
}

// Charge implements Provider. An error after the request may have been
// sent is an unknown outcome.
func (p HTTP) Charge(ctx context.Context, key string, amount int64) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/charges?amount=%d", p.URL, amount), nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	var out struct{ ID string }
	if err := p.do(req, &out); err != nil {
		return "", phase.MaybeHappened(err)
	}
	return out.ID, nil
}

// Lookup implements Provider.
func (p HTTP) Lookup(ctx context.Context, key string) (string, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/charges/"+key, nil)
	if err != nil {
		return "", false, err
	}
	var out struct{ ID string }
	switch err := p.do(req, &out); {
	case errors.Is(err, errNotFound):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return out.ID, true, nil
}

var errNotFound = errors.New("not found")

func (p HTTP) do(req *http.Request, out any) error {
	c := p.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return errNotFound
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("provider answered %s", resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
