package atomicphase_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestCorePackagesImportNeitherTestToolingNorIntegrations keeps what
// otelphase, phasetest, the test harness and the examples pull in
// (OpenTelemetry, testcontainers, goleak, River, stripe-go), and what the
// transport modules pull in (gRPC, protobuf, Connect, NATS), out of the
// packages a program imports to run workflows.
func TestCorePackagesImportNeitherTestToolingNorIntegrations(t *testing.T) {
	t.Parallel()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goTool, "list", "-deps", ".", "./phase", "./recovery", "./keyrow", "./lockttl", "./caller", "./console", "./consume").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list listed only %q", deps)
	}
	for _, p := range deps {
		if p == "testing" {
			t.Errorf("a core package imports testing")
		}
		for _, banned := range []string{"go.opentelemetry.io/", "github.com/atomicphase/atomicphase/otelphase",
			"github.com/testcontainers/", "github.com/chromedp/", "github.com/riverqueue/", "github.com/stripe/", "go.uber.org/goleak",
			"github.com/atomicphase/atomicphase/internal/pgtest", "github.com/atomicphase/atomicphase/internal/pgcluster",
			"github.com/atomicphase/atomicphase/phase/phasetest",
			// The transports live in modules of their own.
			"google.golang.org/grpc", "google.golang.org/protobuf", "google.golang.org/genproto/", "connectrpc.com/",
			"github.com/nats-io/", "github.com/atomicphase/atomicphase/protophase", "github.com/atomicphase/atomicphase/grpcphase",
			"github.com/atomicphase/atomicphase/connectphase", "github.com/atomicphase/atomicphase/natsphase"} {
			if strings.HasPrefix(p, banned) {
				t.Errorf("a core package depends on %s", p)
			}
		}
	}
}

// TestCallerNeedsNoDatabaseDriver keeps package caller light enough for
// any program that calls an idempotent API: the standard library and the
// UUID package only.
func TestCallerNeedsNoDatabaseDriver(t *testing.T) {
	t.Parallel()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./caller").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/atomicphase/atomicphase/caller" && p != "github.com/google/uuid" {
			t.Errorf("package caller depends on %s", p)
		}
	}
}

// TestInternalPackagesDoNotImportPhase keeps the library's building blocks
// and test harness below phase: only the benchmark harness, which measures
// phase, may import it. Tests of a package that uses phase live with that
// package.
func TestInternalPackagesDoNotImportPhase(t *testing.T) {
	t.Parallel()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goTool, "list", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, "./internal/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const phasePkg = "github.com/atomicphase/atomicphase/phase"
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 3 {
		t.Fatalf("go list listed only %q", lines)
	}
	for _, line := range lines {
		fields := strings.Fields(line)
		if fields[0] == "github.com/atomicphase/atomicphase/internal/bench" {
			continue
		}
		for _, imp := range fields[1:] {
			if imp == phasePkg || strings.HasPrefix(imp, phasePkg+"/") {
				t.Errorf("%s imports %s", fields[0], imp)
			}
		}
	}
}
