// Command atomicphase inspects and repairs the idempotency keys of an
// atomicphase database: it shows one key, lists the keys that need an
// operator, frees leases, retries keys on hold, runs the reaper and applies
// or prints the schema migrations. Run it with -h for the commands, flags and exit statuses.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgschema"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/phase"
)

// Exit statuses, documented in usage.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
	exitChanged  = 4
)

// defaultConnectTimeout bounds connecting when the URL sets no
// connect_timeout, so an unreachable database fails the command instead of
// hanging on the operating system's TCP timeout.
const defaultConnectTimeout = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// usage is the help of atomicphase itself; the commands' help comes from
// their command entries.
func usage() string {
	var b strings.Builder
	b.WriteString(`Usage: atomicphase COMMAND [flags] [args]

Inspect and repair the idempotency keys of an atomicphase database.

Commands:
`)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", strings.Join(strings.Fields(c.name+" "+c.required+" "+c.args), " "), c.summary)
	}
	fmt.Fprintf(tw, "  check URL\t%s\n", checkSummary)
	tw.Flush()
	b.WriteString(usageFlags)
	return b.String()
}

const usageFlags = `
Every command takes these flags, and documents its own with -h:
  -database-url URL   PostgreSQL URL or DSN; overrides $DATABASE_URL.
                      Connecting gives up after 10s unless the URL sets
                      connect_timeout. Through PgBouncer in transaction
                      pooling mode, add default_query_exec_mode=cache_describe.
  -json               print JSON for scripts instead of aligned text
  -actor NAME         who acts, recorded in the audit of every action;
                      defaults to cli:$USER
  -schema NAME        the Postgres schema that holds atomicphase's tables,
                      as phase.Config.Schema names it; defaults to the
                      one the connection's search_path finds

Flags follow the command and come before its arguments, as with Go's flag
package: "atomicphase inspect -json acme k1", not "... acme k1 -json".
Flags take one or two dashes (-json, --json), and values follow '=' or a
space (-limit=10, -limit 10). Everything after "--" is an argument, for a
key that starts with a dash: "atomicphase inspect -- acme -k1".

Exit status:
  0  success
  1  operational error: the database is unreachable, a statement failed,
     the key is not in a state the command acts on, or interrupted
  2  usage error: unknown command or flag, wrong arguments, no database
     URL; the usage is printed to stderr
  3  not found: inspect, unlock, hold, retry or resolve of a key that does not
     exist
  4  changed: unlock, hold, retry or resolve refused because the key changed
     since it was seen (-seen; unlock and hold without it, since they read
     it), or has a resolution pending; nothing changed, and the refusal is
     audited
`

// command is one subcommand. define registers the command's own flags and
// returns the action that runs it with the flags parsed; keeping the flag
// variables in a closure lets every command have its own.
type command struct {
	name string
	// required names the flags the command cannot run without.
	required string
	// args names the positional arguments; nargs counts them.
	args    string
	nargs   int
	summary string
	detail  string
	define  func(fs *flag.FlagSet) action
}

// action runs a command on its positional arguments.
type action func(ctx context.Context, s *session, args []string) error

// session is what an action works with: the output, the chosen format and a
// database connected on first use, so that usage errors never need one.
type session struct {
	stdout io.Writer
	json   bool
	dsn    string
	actor  string
	// schema is the -schema flag: where the library's tables are.
	schema string
	pool   *pgxpool.Pool
}

// run executes the command line args (without the program name) and
// returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage())
		return exitOK
	case "check":
		return runCheck(ctx, args[1:], stdout, stderr)
	}
	cmd := lookup(args[0])
	if cmd == nil {
		fmt.Fprintf(stderr, "atomicphase: unknown command %q\n\n%s", args[0], usage())
		return exitUsage
	}

	fs := flag.NewFlagSet("atomicphase "+cmd.name, flag.ContinueOnError)
	// Parse errors are reported below, with the command's own usage.
	fs.SetOutput(io.Discard)
	s := &session{stdout: stdout}
	fs.StringVar(&s.dsn, "database-url", "", "PostgreSQL `URL` or DSN; overrides $DATABASE_URL")
	fs.BoolVar(&s.json, "json", false, "print JSON instead of aligned text")
	fs.StringVar(&s.actor, "actor", "", "who acts, for the audit of unlock, hold, retry, resolve and bulk; defaults to cli:$USER")
	fs.StringVar(&s.schema, "schema", "", "the Postgres `schema` that holds atomicphase's tables; defaults to the search_path's")
	act := cmd.define(fs)

	err := fs.Parse(args[1:])
	switch {
	case errors.Is(err, flag.ErrHelp):
		cmd.usage(stdout, fs)
		return exitOK
	case err != nil:
		err = &usageError{msg: err.Error()}
	default:
		err = cmd.checkArgs(fs.Args())
	}
	if err == nil {
		if serr := pgschema.Check(s.schema); serr != nil {
			err = usagef("-schema: %v", serr)
		}
	}
	if err == nil {
		if s.dsn == "" {
			s.dsn = getenv("DATABASE_URL")
		}
		if s.actor == "" {
			s.actor = "cli:" + cmp.Or(getenv("USER"), "unknown")
		}
		err = act(ctx, s, fs.Args())
		s.close()
	}

	var usageErr *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &usageErr):
		fmt.Fprintf(stderr, "atomicphase %s: %v\n\n", cmd.name, err)
		cmd.usage(stderr, fs)
		return exitUsage
	case errors.Is(err, keyrow.ErrNotFound):
		fmt.Fprintf(stderr, "atomicphase %s: %v\n", cmd.name, err)
		return exitNotFound
	case errors.Is(err, keyrow.ErrChanged):
		fmt.Fprintf(stderr, "atomicphase %s: %v\n", cmd.name, err)
		return exitChanged
	default:
		fmt.Fprintf(stderr, "atomicphase %s: %v\n", cmd.name, err)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
			fmt.Fprintln(stderr, "The database has no atomicphase schema (or it is not on the search_path, or in the schema -schema names): run `atomicphase migrate`, or apply the SQL of `atomicphase migrate -print` with your own tool.")
		}
		return exitError
	}
}

func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// checkArgs reports a wrong number of positional arguments, and explains
// the likeliest cause: a flag written after them, which Go's flag package
// takes for an argument; and a TENANT KEY pair no key could have, which
// the library would refuse to store.
func (c *command) checkArgs(args []string) error {
	if len(args) == c.nargs {
		if c.args != "TENANT KEY" {
			return nil
		}
		if keyrow.CheckTenant(args[0]) != nil {
			return usagef("TENANT must be 1 to %d characters of valid UTF-8 without NUL, got %q", keyrow.MaxTenantLength, args[0])
		}
		if keyrow.CheckKey(args[1]) != nil {
			return usagef("KEY must be 1 to %d characters of valid UTF-8 without NUL, got %q", keyrow.MaxKeyLength, args[1])
		}
		return nil
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			return usagef("flag %s must come before the arguments", a)
		}
	}
	if c.nargs == 0 {
		return usagef("takes no arguments, got %q", args)
	}
	return usagef("want %s, got %d argument(s)", c.args, len(args))
}

func (c *command) usage(w io.Writer, fs *flag.FlagSet) {
	line := strings.Join(strings.Fields("atomicphase "+c.name+" "+c.required+" [flags] "+c.args), " ")
	fmt.Fprintf(w, "Usage: %s\n\n%s\n\nFlags:\n", line, strings.TrimSpace(c.detail))
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	fmt.Fprint(w, "\nRun 'atomicphase -h' for the exit statuses and how flags are parsed.\n")
}

// usageError is a mistake on the command line: exit status 2, with the
// command's usage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// db connects on first use and checks that the database answers, so that
// an unreachable one fails with one clear error.
func (s *session) db(ctx context.Context) (*pgxpool.Pool, error) {
	if s.pool != nil {
		return s.pool, nil
	}
	if s.dsn == "" {
		return nil, usagef("DATABASE_URL is not set; pass -database-url or set DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(s.dsn)
	if err != nil {
		// pgconn redacts the password from the URL it quotes.
		return nil, usagef("invalid database URL: %v", err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		// When the server answered, its answer is the cause (a database
		// that does not exist, a refused login); pgx lists it after the
		// attempts before it, such as the TLS that sslmode=prefer asks
		// for first and a server without TLS refuses.
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			err = pgErr
		}
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	s.pool = pool
	return pool, nil
}

// client connects and returns a client with no workflows, for its operator
// methods, once it has checked that the pool can run them (a URL through
// PgBouncer in transaction pooling mode needs
// default_query_exec_mode=cache_describe). cfg sets what the command
// configures (when a key counts as stuck, the reaper's retention); the
// completer and the reaper never run in the background, and their logs are
// dropped because the command's output and errors say all they would.
func (s *session) client(ctx context.Context, cfg phase.Config) (*phase.Client, error) {
	db, err := s.db(ctx)
	if err != nil {
		return nil, err
	}
	cfg.Schema = s.schema
	cfg.Completer.Interval = -1
	cfg.Reaper.Interval = -1
	cfg.Logger = slog.New(slog.DiscardHandler)
	c, err := phase.NewClient(db, &cfg)
	if err != nil {
		return nil, err
	}
	if err := c.Check(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (s *session) close() {
	if s.pool != nil {
		s.pool.Close()
	}
}

// writeJSON prints v indented, as every command does under -json. HTML
// escaping is off so that keys and errors print as stored.
func (s *session) writeJSON(v any) error {
	enc := json.NewEncoder(s.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
