package connectphase_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/connectphase"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/protophase"
)

// serverEnv, set, makes the test binary a payments server: its value is
// the database's DSN; serverAddrEnv and serverProviderEnv give where it
// listens and the provider's URL.
const (
	serverEnv         = "CONNECTPHASE_TEST_SERVER_DSN"
	serverAddrEnv     = "CONNECTPHASE_TEST_SERVER_ADDR"
	serverProviderEnv = "CONNECTPHASE_TEST_SERVER_PROVIDER"
)

// runServer serves procedure with every default of the client (lease,
// completer) until the process is killed. Its workflow charges the amount
// at the provider under the downstream key, then answers the charge.
func runServer() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(serverEnv))
	if err != nil {
		return err
	}
	provider := os.Getenv(serverProviderEnv)
	type in = phase.Input[protophase.Request[*structpb.Struct], struct{ ID string }]
	w, err := phase.NewWorkflow("charge",
		phase.Foreign("charged", func(ctx context.Context, r *in) (string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider+"?key="+r.DownstreamKey(), nil)
			if err != nil {
				return "", err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return "", phase.MaybeHappened(err)
			}
			defer resp.Body.Close()
			id, err := io.ReadAll(resp.Body)
			return string(id), err
		}, func(ctx context.Context, tx pgx.Tx, r *in, id string) (phase.Result, error) {
			r.State.ID = id
			return phase.Next(), nil
		}).Repeatable(),
		phase.Local("answered", func(ctx context.Context, tx pgx.Tx, r *in) (phase.Result, error) {
			s, err := structpb.NewStruct(map[string]any{"charge_id": r.State.ID})
			if err != nil {
				return phase.Result{}, err
			}
			return protophase.Reply(s), nil
		}))
	if err != nil {
		return err
	}
	c, err := phase.NewClient(pool, &phase.Config{}, w)
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	s, err := connectphase.NewServer(c, connectphase.Config{Tenant: func(context.Context, http.Header) (string, error) { return "acme", nil }})
	if err != nil {
		return err
	}
	if err := connectphase.Handle[*structpb.Struct, structpb.Struct](s, procedure, w, connectphase.MethodConfig[*structpb.Struct]{}); err != nil {
		return err
	}
	h := connect.NewUnaryHandler(procedure, func(context.Context, *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("served by the workflow"))
	}, connect.WithInterceptors(s.Interceptor()))
	lis, err := net.Listen("tcp", os.Getenv(serverAddrEnv))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	fmt.Println("ready")
	return srv.Serve(lis)
}

// provider charges once per downstream key, counting its calls; the first
// call waits for release.
type provider struct {
	mu       sync.Mutex
	calls    map[string]int
	inFlight chan struct{}
	release  chan struct{}
	once     sync.Once
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.once.Do(func() { close(p.inFlight) })
	<-p.release
	key := r.URL.Query().Get("key")
	p.mu.Lock()
	p.calls[key]++
	p.mu.Unlock()
	_, _ = io.WriteString(w, "ch_"+key)
}
