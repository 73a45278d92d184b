package grpcphase_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/grpcphase"
	"github.com/atomicphase/atomicphase/grpcphase/internal/paytest"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

// TestAServerKilledMidCallChargesOnce runs the payments server as a
// process of its own, sends charges through the client interceptor, and
// SIGKILLs the server while its calls to the provider are in flight. The
// provider completes those charges (the server never learns it), the
// server is started again on the same port, and the interceptor's retries
// finish every call: each gets its charge, and the provider, which honours
// no key, was called once per charge. The restarted server reconciles each
// call it found under way by looking the charge up.
//
// With every default (the lease, the client's budget), each call ends with
// its answer, not an unknown outcome: the killed server's leases end
// before the interceptor's budget does.
func TestAServerKilledMidCallChargesOnce(t *testing.T) {
	t.Parallel()
	t.Run("a short lease", func(t *testing.T) {
		t.Parallel()
		killMidCall(t, "1s", grpcphase.ClientConfig{MaxElapsed: time.Minute, MaxAttempts: 100})
	})
	t.Run("every default", func(t *testing.T) {
		t.Parallel()
		killMidCall(t, "", grpcphase.ClientConfig{})
	})
}

func killMidCall(t *testing.T, lease string, cfg grpcphase.ClientConfig) {
	ctx := context.Background()
	pool := phasetest.Pool(t)
	if _, err := pool.Exec(ctx, paytest.Schema); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "payserver")
	if out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "./internal/cmd/payserver").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	provider := paytest.NewMemory()
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	provider.Before = func(context.Context, string, int64) error {
		once.Do(func() { close(inFlight) })
		<-release
		return nil
	}
	providerSrv := httptest.NewServer(provider.Handler())
	t.Cleanup(providerSrv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	start := func() *exec.Cmd {
		cmd := exec.Command(bin)
		cmd.Env = append(cmd.Environ(), "PAYSERVER_DSN="+pool.Config().ConnString(),
			"PAYSERVER_PROVIDER="+providerSrv.URL, "PAYSERVER_ADDR="+addr, "PAYSERVER_LEASE="+lease)
		cmd.Stderr = t.Output()
		// The server dies with the test binary.
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
			t.Fatalf("payserver said %q, not ready", line)
		}
		return cmd
	}
	server := start()

	conn := dial(t, addr, cfg)
	const calls = 4
	answers := make([]*structpb.Struct, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			answers[i], _, errs[i] = call(ctx, conn, fmt.Sprintf("chaos-%d", i), paytest.Request(int64(100+i), ""))
		})
	}
	select {
	case <-inFlight:
	case <-time.After(30 * time.Second):
		t.Fatal("no call reached the provider")
	}
	// Let the other calls reach the provider too, then kill the server.
	time.Sleep(200 * time.Millisecond)
	if err := server.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = server.Wait()
	close(release)
	start()
	wg.Wait()

	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
			continue
		}
		id := answers[i].Fields["charge_id"].GetStringValue()
		if found := false; id != "" {
			for k := range provider.Calls() {
				if got, _, _ := provider.Lookup(ctx, k); got == id {
					found = true
				}
			}
			if !found {
				t.Errorf("call %d: charge %q is not the provider's", i, id)
			}
		}
	}
	calledKeys := 0
	for k, n := range provider.Calls() {
		calledKeys++
		if n != 1 {
			t.Errorf("the provider was called %d times under downstream key %s", n, k)
		}
	}
	if calledKeys != calls {
		t.Errorf("the provider saw %d downstream keys, want %d", calledKeys, calls)
	}
	if rows, charged, err := paytest.Charges(ctx, pool); err != nil || rows != calls || charged != calls {
		t.Errorf("charges: %d rows, %d charged (%v); want %d", rows, charged, err, calls)
	}
}
