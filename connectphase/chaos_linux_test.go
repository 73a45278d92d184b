package connectphase_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/connectphase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

// TestAServerKilledMidCallAnswersAConnectCallerOnEveryDefault kills the
// server process while its call to the provider is in flight, restarts
// it, and expects the caller, through the Connect client interceptor on
// every default (Connect and gRPC protocols), to end with the answer, not
// an unknown outcome: the killed run's lease (lockttl.DefaultTTL) ends
// before the client's budget (caller.DefaultMaxElapsed).
func TestAServerKilledMidCallAnswersAConnectCallerOnEveryDefault(t *testing.T) {
	t.Parallel()
	for _, p := range []struct {
		name string
		opts []connect.ClientOption
	}{{"connect", nil}, {"gRPC", []connect.ClientOption{connect.WithGRPC()}}} {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			killMidCall(t, p.opts...)
		})
	}
}

func killMidCall(t *testing.T, opts ...connect.ClientOption) {
	pool := phasetest.Pool(t)
	prov := &provider{calls: map[string]int{}, inFlight: make(chan struct{}), release: make(chan struct{})}
	provSrv := httptest.NewServer(prov)
	t.Cleanup(provSrv.Close)
	var released sync.Once
	release := func() { released.Do(func() { close(prov.release) }) }
	t.Cleanup(release)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), serverEnv+"="+pool.Config().ConnString(), serverAddrEnv+"="+addr, serverProviderEnv+"="+provSrv.URL)
		cmd.Stderr = t.Output()
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
			t.Fatalf("the server said %q, not ready", line)
		}
		return cmd
	}
	server := start()

	ic, err := connectphase.ClientInterceptor(connectphase.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	transport := &http.Transport{Protocols: new(http.Protocols)}
	transport.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(transport.CloseIdleConnections)
	client := connect.NewClient[structpb.Struct, structpb.Struct](&http.Client{Transport: transport}, "http://"+addr+procedure,
		append(opts, connect.WithInterceptors(ic))...)
	type answer struct {
		resp *connect.Response[structpb.Struct]
		err  error
	}
	done := make(chan answer, 1)
	began := time.Now()
	go func() {
		msg, _ := structpb.NewStruct(map[string]any{"amount": 1200})
		resp, err := client.CallUnary(context.Background(), connect.NewRequest(msg))
		done <- answer{resp, err}
	}()
	select {
	case <-prov.inFlight:
	case <-time.After(30 * time.Second):
		t.Fatal("the call never reached the provider")
	}
	if err := server.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = server.Wait()
	release()
	start()
	a := <-done
	if a.err != nil {
		t.Fatalf("after %v: %v; want the answer", time.Since(began), a.err)
	}
	t.Logf("answered after %v", time.Since(began))
	id := a.resp.Msg.GetFields()["charge_id"].GetStringValue()
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if len(prov.calls) != 1 || id != "ch_"+firstKey(prov.calls) {
		t.Errorf("the provider saw downstream keys %v and the answer is %q; want one key, its charge", prov.calls, id)
	}
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}
