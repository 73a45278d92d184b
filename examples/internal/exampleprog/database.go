package exampleprog

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgcluster"
)

// DatabaseURL defines the -database-url flag, documented by usage, whose
// default is $DATABASE_URL. Like every SecretString, -h never prints its
// value: a database URL may hold a password.
func DatabaseURL(fs *flag.FlagSet, usage string) *string {
	return SecretString(fs, "database-url", "DATABASE_URL", "", usage)
}

// DefaultConnectTimeout bounds connecting to a database whose URL sets no
// connect_timeout, so that a server that never answers fails the program
// with an error instead of leaving it silent for the operating system's TCP
// timeout.
const DefaultConnectTimeout = 10 * time.Second

// Database is what OpenDatabase opens.
type Database struct {
	// URL is the Postgres URL to connect to. Empty starts an embedded
	// throwaway Postgres instead: from the local server binaries (see
	// package pgcluster) or, on a machine without them, from binaries
	// downloaded once (DownloadVersion, from $EnvDownloadURL).
	URL string
	// PoolSize is how many connections the pool may hold at least, for a
	// program whose servers, clients and background workers all share it; a
	// URL asking for more (pool_max_conns) gets more. Zero means pgxpool's
	// default.
	PoolSize int32
	// Migrate applies the program's schemas. Nil means none.
	Migrate func(context.Context, *pgxpool.Pool) error
	// Progress receives a line saying where the data lives before the
	// database is opened: the URL connected to (without its password), or
	// the embedded Postgres, which announces itself as throwaway. Nil means
	// io.Discard.
	Progress io.Writer
}

// OpenDatabase connects to d.URL, or to an embedded throwaway Postgres, and
// migrates it. Connecting gives up after DefaultConnectTimeout unless the
// URL sets connect_timeout. closeDB closes the pool and removes the embedded
// Postgres.
func OpenDatabase(ctx context.Context, d Database) (pool *pgxpool.Pool, closeDB func(), err error) {
	url, stop := d.URL, func() {}
	if url == "" {
		progress := d.Progress
		if progress == nil {
			progress = io.Discard
		}
		fmt.Fprintln(progress, "no database URL given: starting an embedded throwaway Postgres...")
		url, stop, err = throwaway(ctx, progress)
		if err != nil {
			return nil, nil, err
		}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		stop()
		// pgconn redacts the password from the URL it quotes.
		return nil, nil, fmt.Errorf("database URL: %w", err)
	}
	cfg.MaxConns = max(cfg.MaxConns, d.PoolSize)
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	where := Describe(&cfg.ConnConfig.Config)
	if d.Progress != nil {
		if d.URL == "" {
			fmt.Fprintf(d.Progress, "database: %s\n"+
				"  THROWAWAY: deleted with everything in it, idempotency keys included, when this program exits;\n"+
				"  set DATABASE_URL or -database-url to a database that outlives it\n", where)
		} else {
			fmt.Fprintf(d.Progress, "database: %s\n", where)
		}
	}
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		// The pool connects lazily: fail here, with the address, rather
		// than in the first migration.
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		stop()
		// When the server answered, its answer is the cause (a database
		// that does not exist, a refused login); pgx lists it after the
		// attempts before it, such as the TLS that sslmode=prefer asks
		// for first and a server without TLS refuses.
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			err = pgErr
		}
		return nil, nil, fmt.Errorf("connect to %s: %w", where, err)
	}
	if d.Migrate != nil {
		if err := d.Migrate(ctx, pool); err != nil {
			pool.Close()
			stop()
			return nil, nil, err
		}
	}
	return pool, func() { pool.Close(); stop() }, nil
}

// throwaway starts a Postgres that lives as long as the program, from the
// local server binaries or, when there are none, from binaries it
// downloads.
func throwaway(ctx context.Context, progress io.Writer) (dsn string, stop func(), err error) {
	c, err := pgcluster.Start(ctx)
	if errors.Is(err, pgcluster.ErrNoBinaries) {
		return downloaded(progress, err)
	}
	if err != nil {
		return "", nil, fmt.Errorf("no database URL given, and the embedded Postgres did not start (%w); "+
			"set DATABASE_URL or -database-url to a Postgres URL", err)
	}
	return c.DSN("postgres"), func() { _ = c.Stop() }, nil
}

// EnvDownloadURL names the environment variable holding the base URL of
// the Maven repository that a program run without a database URL, on a
// machine without the PostgreSQL server binaries, downloads them from.
// Defaults to DefaultDownloadURL.
const EnvDownloadURL = "ATOMICPHASE_POSTGRES_DOWNLOAD_URL"

// DefaultDownloadURL is Maven Central, which holds the Zonky project's
// builds of the PostgreSQL server (io.zonky.test.postgres) for each
// operating system and processor.
const DefaultDownloadURL = "https://repo1.maven.org/maven2"

// DownloadVersion is the PostgreSQL version downloaded.
const DownloadVersion = embeddedpostgres.V18

// downloaded starts a throwaway Postgres from server binaries downloaded
// from $EnvDownloadURL on first use and cached under the user's cache
// directory (atomicphase/postgres), for a machine with Go and nothing
// else. missing is why the local binaries were not used.
//
// The server is started with pg_ctl, as a daemon: stop stops it, and so
// does a program that ends by returning from main or by an interrupt or
// SIGTERM, which cancel its context. One that is killed with SIGKILL leaves
// the server running, and its directory in the temporary directory, until
// the next program to start one stops it (stopAbandoned).
func downloaded(progress io.Writer, missing error) (dsn string, stop func(), err error) {
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root; pgcluster runs local
		// binaries as the postgres user, but embedded-postgres runs them
		// as whoever calls it.
		return "", nil, fmt.Errorf("no database URL given, and %v; a downloaded server cannot run as root, "+
			"which initdb refuses: set DATABASE_URL or -database-url to a Postgres URL, "+
			"install the PostgreSQL server binaries, or run this program as a user other than root", missing)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", nil, fmt.Errorf("no database URL given, and %v; no cache directory to download them into: %w", missing, err)
	}
	cache = filepath.Join(cache, "atomicphase", "postgres")
	bins := filepath.Join(cache, string(DownloadVersion))
	repo := cmp.Or(os.Getenv(EnvDownloadURL), DefaultDownloadURL)
	if _, err := os.Stat(filepath.Join(bins, "bin", "pg_ctl")); err != nil {
		fmt.Fprintf(progress, "no PostgreSQL server binaries on this machine: downloading PostgreSQL %s "+
			"(about %d MB, once) from %s into %s...\n", DownloadVersion, downloadMB, repo, cache)
	}
	stopAbandoned(bins)
	dir, err := os.MkdirTemp("", serverDirPrefix)
	if err != nil {
		return "", nil, err
	}
	remove := func() { _ = os.RemoveAll(dir) }
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		remove()
		return "", nil, err
	}
	port, err := freePort()
	if err != nil {
		remove()
		return "", nil, err
	}
	settings := map[string]string{"unix_socket_directories": dir}
	args := pgcluster.SettingArgs()
	for i := 1; i < len(args); i += 2 {
		name, value, _ := strings.Cut(args[i], "=")
		settings[name] = value
	}
	srv := embeddedpostgres.NewDatabase(embeddedpostgres.DefaultConfig().
		Version(DownloadVersion).
		BinaryRepositoryURL(repo).
		CachePath(cache).
		BinariesPath(bins).
		RuntimePath(filepath.Join(dir, "run")).
		DataPath(filepath.Join(dir, "data")).
		Port(port).
		StartParameters(settings).
		Logger(io.Discard))
	if err := srv.Start(); err != nil {
		remove()
		return "", nil, fmt.Errorf("no database URL given, and %v; the downloaded PostgreSQL did not start: %w", missing, err)
	}
	dsn = fmt.Sprintf("postgres://postgres:postgres@localhost:%d/postgres?sslmode=disable", port)
	return dsn, func() { _ = srv.Stop(); remove() }, nil
}

// downloadMB is about what the first download of DownloadVersion weighs,
// by the Zonky project's account of its bundles.
const downloadMB = 10

// serverDirPrefix starts the name of the temporary directory of each
// downloaded server, which holds its data directory and ownerFile.
const serverDirPrefix = "atomicphase-postgres-"

// ownerFile holds the PID of the program that started a downloaded server.
const ownerFile = "owner.pid"

// stopAbandoned stops, with pg_ctl from bins, the downloaded servers whose
// programs were killed without stopping them, and removes their
// directories.
func stopAbandoned(bins string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), serverDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being created, or not a server's
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || alive(owner) {
			continue
		}
		data := filepath.Join(dir, "data")
		if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
			stop := exec.Command(filepath.Join(bins, "bin", "pg_ctl"), "stop", "-m", "immediate", "-w", "-D", data)
			if stop.Run() != nil {
				continue
			}
		}
		_ = os.RemoveAll(dir)
	}
}

// alive reports whether the process pid exists.
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	if runtime.GOOS == "windows" {
		return true // found, and Windows has no signal 0
	}
	// Signal 0 checks without signalling; EPERM means another user's.
	err = p.Signal(syscall.Signal(0))
	return err == nil || errors.Is(err, os.ErrPermission)
}

// freePort returns a TCP port on localhost that nothing listens on now.
func freePort() (uint32, error) {
	ln, err := net.Listen("tcp", "localhost:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return uint32(ln.Addr().(*net.TCPAddr).Port), nil
}

// Describe names the database cfg connects to as a URL without its
// password, fit to print: postgres://user@host:port/database, or with the
// host in the query for a Unix socket.
func Describe(cfg *pgconn.Config) string {
	u := url.URL{Scheme: "postgres", User: url.User(cfg.User), Path: "/" + cfg.Database}
	port := strconv.Itoa(int(cfg.Port))
	if strings.HasPrefix(cfg.Host, "/") {
		// Unescaped, as people write it; libpq reads it either way.
		u.RawQuery = "host=" + cfg.Host + "&port=" + port
	} else {
		u.Host = net.JoinHostPort(cfg.Host, port)
	}
	return u.String()
}
