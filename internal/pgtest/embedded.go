package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/atomicphase/atomicphase/internal/pgcluster"
)

// Embedded starts a throwaway PostgreSQL server for a program that is not a
// test, such as a demo, and returns the DSN of its postgres database, which
// is empty: the program migrates it itself. The server is a container when
// Docker is running, or else a Cluster from local binaries; EnvDSN is not
// consulted. stop removes the server and everything in it. The server also
// dies with the program if stop is never called.
func Embedded(ctx context.Context) (dsn string, stop func(), err error) {
	tw, err := startThrowaway(ctx, false)
	if err != nil {
		return "", nil, err
	}
	return tw.dsn, func() { _ = tw.stop() }, nil
}

// throwaway is a server this package started.
type throwaway struct {
	dsn     string       // DSN of the postgres database
	cluster *Cluster     // the server, when started from local binaries
	stop    func() error // removes the server
}

// startThrowaway starts a container when Docker is healthy and a Cluster
// otherwise. A container that fails to start (an image that cannot be
// pulled, say) also falls back to a Cluster. When pgcluster.EnvBinDir names
// the server binaries to run, Docker is not tried: the caller chose them.
func startThrowaway(ctx context.Context, mentionEnv bool) (throwaway, error) {
	var dockerErr error
	if os.Getenv(pgcluster.EnvBinDir) != "" {
		dockerErr = fmt.Errorf("not tried: %s is set", pgcluster.EnvBinDir)
	} else {
		dockerErr = dockerHealthy(ctx)
	}
	if dockerErr == nil {
		tw, err := startContainer(ctx)
		if err == nil {
			return tw, nil
		}
		dockerErr = err
	}
	c, localErr := pgcluster.Start(ctx)
	if localErr != nil {
		return throwaway{}, &noServerError{mentionEnv: mentionEnv, docker: dockerErr, local: localErr}
	}
	return throwaway{dsn: c.DSN("postgres"), cluster: c, stop: c.Stop}, nil
}

// noServerError reports that no source of PostgreSQL worked, and how to
// provide one.
type noServerError struct {
	mentionEnv bool
	docker     error
	local      error
}

func (e *noServerError) Error() string {
	var b strings.Builder
	b.WriteString("pgtest: no PostgreSQL server available; do one of these:\n")
	if e.mentionEnv {
		fmt.Fprintf(&b, "  - set %s to the DSN of a server where the tests may create databases\n", EnvDSN)
	}
	fmt.Fprintf(&b, "  - start Docker (%v)\n", e.docker)
	fmt.Fprintf(&b, "  - install the PostgreSQL server binaries, with initdb and postgres on PATH or in pg_config --bindir (%v)", e.local)
	return b.String()
}

func (e *noServerError) Unwrap() []error { return []error{e.docker, e.local} }
