package grpcphase_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/atomicphase/atomicphase/grpcphase/internal/paytest"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

// TestTheDocsExampleChargesOnceAndReplays runs docs/grpc.md's complete
// example: a call through the client interceptor whose key is the
// request_id field runs once, its retry is replayed, the same request_id
// of another account is another charge, and a call without a token runs
// nothing.
func TestTheDocsExampleChargesOnceAndReplays(t *testing.T) {
	t.Parallel()
	pool := phasetest.Pool(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	provider := paytest.NewMemory()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveCharges(ctx, pool, lis, provider) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serveCharges: %v", err)
		}
	})
	addr := lis.Addr().String()
	var first string
	for i := range 2 {
		resp, replayed, err := charge(ctx, addr, "acme", "req-1", 1200)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		id := resp.GetFields()["charge_id"].GetStringValue()
		if i == 0 {
			first = id
		}
		if id == "" || id != first || replayed != (i == 1) {
			t.Errorf("call %d: charge %q replayed %v; want %q, replayed on the retry only", i, id, replayed, first)
		}
	}
	if _, replayed, err := charge(ctx, addr, "globex", "req-1", 1200); err != nil || replayed {
		t.Errorf("another account's req-1: %v, replayed %v; want a charge of its own", err, replayed)
	}
	if _, _, err := charge(ctx, addr, "", "req-2", 1200); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no token: %v; want UNAUTHENTICATED", err)
	}
	calls := provider.Calls()
	for k, n := range calls {
		if n != 1 {
			t.Errorf("downstream key %s sent %d times; want 1", k, n)
		}
	}
	if len(calls) != 2 {
		t.Errorf("the provider saw %d downstream keys; want 2", len(calls))
	}
}

// TestDocsGRPCQuotesTheCompiledExample keeps docs/grpc.md's complete
// example identical to the code the test above runs.
func TestDocsGRPCQuotesTheCompiledExample(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../docs/grpc.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_payments_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, code, _ := strings.Cut(string(src), "// example:begin\n")
	code, _, ok := strings.Cut(code, "// example:end\n")
	if !ok {
		t.Fatal("example_payments_test.go has no example:begin / example:end markers")
	}
	_, block, _ := strings.Cut(string(page), "## A complete example")
	_, block, _ = strings.Cut(block, "```go\n")
	block, _, ok = strings.Cut(block, "```\n")
	if !ok {
		t.Fatal("docs/grpc.md's complete example has no Go block")
	}
	if strings.TrimSpace(block) != strings.TrimSpace(code) {
		t.Error("docs/grpc.md's complete example differs from example_payments_test.go between its markers; copy it into the page")
	}
}
