package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestDemoRunsAndEveryInvariantHolds(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-database-url", pgtest.DSN(t), "-duration", "2s", "-concurrency", "4"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("demo exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, check := range []string{"money conserved", "double entry", "no negative balance", "each transfer moved once",
		"one payout per external transfer", "no hold left behind", "duplicates answered alike", "every transfer finished"} {
		if !regexp.MustCompile(`(?m)^` + check + ` +ok `).MatchString(stdout.String()) {
			t.Errorf("report has no passing %q line:\n%s", check, stdout.String())
		}
	}
}

func TestVerifyExitsNonZeroWhenAnInvariantFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	db, closeDB, err := database(ctx, dsn, migrateAll, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB()
	if _, err := openDemoAccounts(ctx, db); err != nil {
		t.Fatal(err)
	}
	verify := func() (int, string) {
		var stdout, stderr bytes.Buffer
		code := run(ctx, []string{"verify", "-database-url", dsn}, &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	if code, out := verify(); code != 0 || strings.Contains(out, "FAILED") {
		t.Fatalf("verify of a sound ledger exited %d:\n%s", code, out)
	}
	// Money from nowhere: a balance raised without an entry.
	if _, err := db.Exec(ctx, `UPDATE ledger_accounts SET balance = balance + 1 WHERE owner = 'bob'`); err != nil {
		t.Fatal(err)
	}
	if code, out := verify(); code != 1 || !regexp.MustCompile(`(?m)^money conserved +FAILED `).MatchString(out) {
		t.Fatalf("verify of a broken ledger exited %d, want 1 naming the failed check:\n%s", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"help"}, 0},
		{[]string{"serve", "-h"}, 0},
		{[]string{"bogus"}, 2},
		{[]string{"-duration", "0s"}, 2},
		{[]string{"verify", "-database-url", ""}, 2},
		{[]string{"payouts", "extra"}, 2},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != tc.code {
			t.Errorf("transfers %v exited %d, want %d\n%s%s", tc.args, code, tc.code, stdout.String(), stderr.String())
		}
	}
}
