package exampleprog

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/atomicphase/atomicphase/internal/pgcluster"
)

// DatabaseURL defines the -database-url flag, documented by usage, whose
// default is $DATABASE_URL.
func DatabaseURL(fs *flag.FlagSet, usage string) *string {
	return fs.String("database-url", os.Getenv("DATABASE_URL"), usage)
}

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
	// Progress receives a line when the embedded Postgres starts, which
	// takes a while. Nil means io.Discard.
	Progress io.Writer
}

// OpenDatabase connects to d.URL, or to an embedded throwaway Postgres, and
// migrates it. closeDB closes the pool and removes the embedded Postgres.
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
		return nil, nil, fmt.Errorf("database URL: %w", err)
	}
	cfg.MaxConns = max(cfg.MaxConns, d.PoolSize)
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		stop()
		return nil, nil, err
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
