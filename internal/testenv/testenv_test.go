package testenv_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/internal/testenv"
)

// TestSkipWithoutSkipsUnlessRequired runs a test that lacks a program in
// a child process, once with the program optional and once required.
func TestSkipWithoutSkipsUnlessRequired(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") != "" {
		testenv.SkipWithout(t, "pgbouncer", errors.New("pgbouncer not found on PATH"))
		t.Log("not reached")
		return
	}
	for _, c := range []struct {
		require  string
		wantFail bool
		want     string
	}{
		{"", false, "--- SKIP: TestSkipWithoutSkipsUnlessRequired"},
		{"psql,stripe-mock", false, "skipped, needs pgbouncer: pgbouncer not found on PATH"},
		{"psql,pgbouncer", true, "pgbouncer is required (ATOMICPHASE_TEST_REQUIRE=psql,pgbouncer) but cannot be used: pgbouncer not found on PATH"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSkipWithoutSkipsUnlessRequired$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", testenv.RequireEnv+"="+c.require)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != c.wantFail {
			t.Errorf("%s=%q: failed %v, want %v\n%s", testenv.RequireEnv, c.require, failed, c.wantFail, out)
		}
		if !strings.Contains(string(out), c.want) || strings.Contains(string(out), "not reached") {
			t.Errorf("%s=%q: output lacks %q or went on\n%s", testenv.RequireEnv, c.require, c.want, out)
		}
	}
}
