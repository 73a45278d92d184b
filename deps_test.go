package atomicphase_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestCorePackagesDoNotDependOnOpenTelemetry keeps OpenTelemetry, and the
// rest of what otelphase and the examples pull in, out of the packages a
// program imports to run workflows.
func TestCorePackagesDoNotDependOnOpenTelemetry(t *testing.T) {
	t.Parallel()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goTool, "list", "-deps", ".", "./phase", "./recovery", "./keyrow", "./lockttl").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list listed only %q", deps)
	}
	for _, p := range deps {
		for _, banned := range []string{"go.opentelemetry.io/", "github.com/atomicphase/atomicphase/otelphase",
			"github.com/testcontainers/", "github.com/riverqueue/", "github.com/stripe/"} {
			if strings.HasPrefix(p, banned) {
				t.Errorf("a core package depends on %s", p)
			}
		}
	}
}
