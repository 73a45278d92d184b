package atomicphase_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLibraryDoesNotImportTestTooling: phase/phasetest brings testcontainers,
// goleak and the test database harness into the tests that import it; a
// program that imports the library must not get them.
func TestLibraryDoesNotImportTestTooling(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".", "./phase", "./recovery", "./keyrow", "./lockttl").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"testcontainers", "goleak", "/internal/pgtest", "/internal/pgcluster", "/phasetest"} {
			if strings.Contains(pkg, banned) || pkg == "testing" {
				t.Errorf("the library imports %s", pkg)
			}
		}
	}
}
