package exampleprog_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/atomicphase/atomicphase/internal/exampleprog"
)

// greet is a program whose demo command greets -name and whose fail
// command fails.
var greet = exampleprog.Program{
	Name:  "greet",
	Usage: "usage: greet [demo flags] | greet fail\n",
	Commands: map[string]exampleprog.Command{
		"demo": func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			fs := exampleprog.Flags("greet", "greet: say hello.", stderr)
			name := fs.String("name", "world", "whom to greet")
			if err := exampleprog.Parse(fs, args); err != nil {
				return err
			}
			_, err := io.WriteString(stdout, "hello, "+*name+"\n")
			return err
		},
		"fail": func(context.Context, []string, io.Writer, io.Writer) error {
			return errors.New("no greeting today")
		},
	},
}

func TestRunExitsWithTheStatusTheOutcomeCallsFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args              []string
		code              int
		stdout, stderrHas string
	}{
		{nil, 0, "hello, world\n", ""},
		{[]string{"-name", "gopher"}, 0, "hello, gopher\n", ""},
		{[]string{"demo", "-name", "gopher"}, 0, "hello, gopher\n", ""},
		{[]string{"help"}, 0, greet.Usage, ""},
		{[]string{"-h"}, 0, "", "greet: say hello.\n\nFlags:\n  -name string"},
		{[]string{"-nope"}, 2, "", "flag provided but not defined: -nope"},
		{[]string{"demo", "extra"}, 2, "", "unexpected arguments: [extra]"},
		{[]string{"bogus"}, 2, "", `greet: unknown command "bogus"` + "\n\n" + greet.Usage},
		{[]string{"fail"}, 1, "", "greet: no greeting today\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := greet.Run(context.Background(), tc.args, &stdout, &stderr)
		if code != tc.code || stdout.String() != tc.stdout || !strings.Contains(stderr.String(), tc.stderrHas) {
			t.Errorf("greet %q exited %d, want %d\nstdout: %q, want %q\nstderr: %q, want it to hold %q",
				tc.args, code, tc.code, stdout.String(), tc.stdout, stderr.String(), tc.stderrHas)
		}
	}
}
