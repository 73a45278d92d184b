package exampleprog

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

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
	// throwaway Postgres from the local server binaries instead (see
	// package pgcluster).
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
		c, err := pgcluster.Start(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("no database URL given, and no embedded Postgres (%w); "+
				"set DATABASE_URL or -database-url to a Postgres URL, or install the PostgreSQL server binaries (initdb and postgres)", err)
		}
		url, stop = c.DSN("postgres"), func() { _ = c.Stop() }
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
