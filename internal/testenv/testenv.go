// Package testenv tells the tests what this machine provides beyond Go and
// Postgres: a test that needs an optional program (pgbouncer, psql,
// stripe-mock) skips in one line naming it when the program is missing,
// unless the environment demands the program, as CI does.
package testenv

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// RequireEnv names the environment variable listing, comma-separated, the
// optional programs the tests must find: a test that cannot use a program
// listed there fails instead of skipping. `.ci/run` sets it after
// installing them.
const RequireEnv = "ATOMICPHASE_TEST_REQUIRE"

// Required reports whether RequireEnv lists program.
func Required(program string) bool {
	return slices.Contains(strings.Split(os.Getenv(RequireEnv), ","), program)
}

// SkipWithout ends t, which needs program and could not use it for the
// reason err gives: it skips t with one line naming program and err, or
// fails t when RequireEnv lists program.
func SkipWithout(t testing.TB, program string, err error) {
	t.Helper()
	if Required(program) {
		t.Fatalf("%s is required (%s=%s) but cannot be used: %v", program, RequireEnv, os.Getenv(RequireEnv), err)
	}
	t.Skipf("skipped, needs %s: %v (%s=%s fails instead of skipping)", program, err, RequireEnv, program)
}
