package exampleprog

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DatabaseUsage documents the -database-url flag of a command that starts
// an embedded throwaway Postgres when the flag is empty.
const DatabaseUsage = "Postgres `URL` (default $DATABASE_URL; an embedded throwaway Postgres, deleted on exit, when empty)"

// Service is the -addr and -database-url flags of a command that serves an
// HTTP API on a database, and what Open opens with them.
type Service struct {
	addr, databaseURL *string
	ln                net.Listener
	// Pool is the database, once Open has opened it.
	Pool    *pgxpool.Pool
	closeDB func()
}

// ServiceFlags defines on fs the flags -addr, whose default is addr, and
// -database-url (see DatabaseURL and DatabaseUsage).
func ServiceFlags(fs *flag.FlagSet, addr string) *Service {
	return &Service{
		addr:        fs.String("addr", addr, "address to listen on"),
		databaseURL: DatabaseURL(fs, DatabaseUsage),
	}
}

// Open listens on -addr and then opens the database that -database-url
// names, as OpenDatabase opens d with that URL. It listens first, before it
// opens the database or anything starts in the background, so that an
// address already in use stops the command at once with that error. Close
// releases what Open opened.
func (s *Service) Open(ctx context.Context, d Database) error {
	ln, err := net.Listen("tcp", *s.addr)
	if err != nil {
		return err
	}
	d.URL = *s.databaseURL
	pool, closeDB, err := OpenDatabase(ctx, d)
	if err != nil {
		ln.Close()
		return err
	}
	s.ln, s.Pool, s.closeDB = ln, pool, closeDB
	return nil
}

// Serve serves h on the listener Open opened until ctx ends, as Serve
// does.
func (s *Service) Serve(ctx context.Context, h http.Handler, msg string, attrs ...any) error {
	return Serve(ctx, s.ln, h, msg, attrs...)
}

// Close closes the database and the listener that Open opened.
func (s *Service) Close() {
	s.closeDB()
	s.ln.Close()
}

// StopTimeout bounds how long a command waits, once its server has shut
// down, for what runs beside it to stop.
const StopTimeout = 10 * time.Second

// Stop calls stop with a context that ends after StopTimeout.
func Stop(stop func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
	defer cancel()
	return stop(ctx)
}

// API is a command that runs one HTTP API alone on its database, such as
// one of the examples' fake providers.
type API struct {
	// Name and Doc are the command's name and its -h text, as for Flags.
	Name, Doc string
	// Addr is the default of -addr.
	Addr string
	// PoolSize is the least number of connections the pool may hold (see
	// Database).
	PoolSize int32
	// Migrate applies the API's schema.
	Migrate func(context.Context, *pgxpool.Pool) error
	// New builds the API on the database.
	New func(*pgxpool.Pool) http.Handler
	// Listening is the message logged once the API serves.
	Listening string
}

// Run runs the command: it parses args, opens the Service and serves the
// API until ctx ends.
func (a API) Run(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := Flags(a.Name, a.Doc, stderr)
	svc := ServiceFlags(fs, a.Addr)
	if err := Parse(fs, args); err != nil {
		return err
	}
	if err := svc.Open(ctx, Database{PoolSize: a.PoolSize, Migrate: a.Migrate, Progress: stderr}); err != nil {
		return err
	}
	defer svc.Close()
	return svc.Serve(ctx, a.New(svc.Pool), a.Listening)
}
