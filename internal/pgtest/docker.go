package pgtest

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/atomicphase/atomicphase/internal/pgcluster"
)

const (
	// containerImage is the server image tests run against when Docker is
	// available.
	containerImage = "postgres:15-alpine"

	// dockerProbeTimeout bounds the check for a Docker engine, so that
	// machines without one fall through to local binaries at once.
	dockerProbeTimeout = 2 * time.Second
)

// dockerHealthy returns nil when a Docker engine answers.
func dockerHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, dockerProbeTimeout)
	defer cancel()
	// The probe runs in its own goroutine because locating the engine
	// ignores ctx: a DOCKER_HOST that does not answer would block it. Such a
	// goroutine is abandoned, which costs less than waiting for it.
	result := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				result <- fmt.Errorf("docker provider panicked: %v", r)
			}
		}()
		provider, err := testcontainers.NewDockerProvider()
		if err != nil {
			result <- err
			return
		}
		result <- provider.Health(ctx) // Health also closes the provider.
	}()
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return fmt.Errorf("docker did not answer within %v", dockerProbeTimeout)
	}
}

// startContainer starts a postgres container. testcontainers' reaper removes
// it once this process is gone, even if stop is never called.
func startContainer(ctx context.Context) (throwaway, error) {
	ctr, err := postgres.Run(ctx, containerImage,
		postgres.BasicWaitStrategies(),
		testcontainers.WithCmdArgs(pgcluster.SettingArgs()...),
	)
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return throwaway{}, err
	}
	stop := func() error { return testcontainers.TerminateContainer(ctr) }
	dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = stop()
		return throwaway{}, err
	}
	return throwaway{dsn: dsn, stop: stop}, nil
}
