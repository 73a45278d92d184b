package exampleprog

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// DefaultCommand is the command Run runs when the first argument is a flag
// or there is none.
const DefaultCommand = "demo"

// ExitStatus documents the exit statuses of Program.Run, for the end of a
// program's Usage.
const ExitStatus = "Exit status: 0 success, 1 error or failed invariant, 2 usage error.\n"

// ErrUsage is returned, wrapped or not, by a command that was called
// wrongly, after it has said how on stderr. Run exits 2 for it.
var ErrUsage = errors.New("usage")

// Command is a subcommand: it runs with the arguments after its name and
// writes its results to stdout and its progress and complaints to stderr.
type Command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// Program is an example program made of subcommands.
type Program struct {
	// Name starts the program's error messages.
	Name string
	// Usage is what help prints, and what follows the complaint about an
	// unknown command.
	Usage string
	// Commands are the subcommands by name, DefaultCommand among them.
	Commands map[string]Command
}

// Main runs p with the process's arguments and exits with its status. An
// interrupt or SIGTERM cancels the command's context, so that it can shut
// down gracefully.
func (p Program) Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := p.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Run runs the command args name, or DefaultCommand when args start with a
// flag or are empty, and returns the exit status (see the package doc's
// Commands); "help" prints Usage.
func (p Program) Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := DefaultCommand
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if name == "help" {
		fmt.Fprint(stdout, p.Usage)
		return 0
	}
	cmd, ok := p.Commands[name]
	if !ok {
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", p.Name, name, p.Usage)
		return 2
	}
	err := cmd(ctx, args, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	}
	// The example's packages start their errors with the program's name
	// too (rides: river migrate: ...); say it once.
	msg := err.Error()
	if !strings.HasPrefix(msg, p.Name+": ") {
		msg = p.Name + ": " + msg
	}
	fmt.Fprintln(stderr, msg)
	return 1
}

// Flags returns an empty flag set for the command name whose -h prints doc
// and then the flags' defaults to stderr.
func Flags(name, doc string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\n\nFlags:\n", doc)
		fs.PrintDefaults()
	}
	return fs
}

// SecretString defines a string flag whose default is the environment
// variable env, or fallback when env is empty. -h never prints the value,
// which may be a password or an API key: usage should name env instead.
func SecretString(fs *flag.FlagSet, name, env, fallback, usage string) *string {
	v := cmp.Or(os.Getenv(env), fallback)
	fs.Func(name, usage, func(s string) error { v = s; return nil })
	return &v
}

// Parse parses args into fs. It returns flag.ErrHelp for -h, and ErrUsage
// for a bad flag or any argument left over, once the flag set has said what
// is wrong.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return ErrUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %v\n", fs.Args())
		return ErrUsage
	}
	return nil
}
