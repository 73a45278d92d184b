package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Citus is a distributed PostgreSQL cluster on this machine: a coordinator
// and workers, each a [Cluster] with the citus extension loaded and created
// in its postgres database, the workers added to the coordinator. Nodes
// reach each other through their Unix sockets.
type Citus struct {
	Coordinator *Cluster
	Workers     []*Cluster
}

// CitusInstalled reports whether the citus extension is installed for the
// server binaries Start would run, and if not, why.
func CitusInstalled() error {
	bins, err := findBinaries()
	if err != nil {
		return err
	}
	// Extensions sit in the lib directory beside the real bin directory
	// (/usr/lib/postgresql/15/lib), wherever PATH found a link to it.
	postgres, err := filepath.EvalSymlinks(bins.postgres)
	if err != nil {
		return err
	}
	lib := filepath.Join(filepath.Dir(filepath.Dir(postgres)), "lib", "citus.so")
	if _, err := os.Stat(lib); err != nil {
		return fmt.Errorf("the citus extension is not installed for %s (no %s)", filepath.Dir(postgres), lib)
	}
	return nil
}

// StartCitus starts a coordinator and workers workers, with settings
// applied to every node as Start applies them, and returns once the
// workers are members of the coordinator's cluster.
func StartCitus(ctx context.Context, workers int, settings ...string) (*Citus, error) {
	if err := CitusInstalled(); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	settings = append([]string{"shared_preload_libraries=citus"}, settings...)
	c := &Citus{}
	for i := 0; i <= workers; i++ {
		node, err := Start(ctx, settings...)
		if err != nil {
			return nil, errors.Join(err, c.Stop())
		}
		if i == 0 {
			c.Coordinator = node
		} else {
			c.Workers = append(c.Workers, node)
		}
		if err := Exec(ctx, node.DSN("postgres"), "CREATE EXTENSION citus"); err != nil {
			return nil, errors.Join(err, c.Stop())
		}
	}
	stmts := []string{fmt.Sprintf("SELECT citus_set_coordinator_host(%s, %d)", quoteLiteral(c.Coordinator.dir), clusterPort)}
	for _, w := range c.Workers {
		stmts = append(stmts, fmt.Sprintf("SELECT citus_add_node(%s, %d)", quoteLiteral(w.dir), clusterPort))
	}
	for _, stmt := range stmts {
		if err := Exec(ctx, c.Coordinator.DSN("postgres"), stmt); err != nil {
			return nil, errors.Join(err, c.Stop())
		}
	}
	return c, nil
}

// ReplaceWorker points the coordinator at new in place of the worker old
// (citus_update_node), as an operator does once a failed worker's standby
// is promoted: the shards old held are from then on reached on new, which
// takes old's place among c.Workers, its node ID and its group (so that
// Citus's recovery of prepared transactions looks for old's on new).
// Queries under way on old's shards finish first, those that failed when
// old died among them. old is no longer c's to stop: Stop it, or Rebuild
// it as a standby of new.
func (c *Citus) ReplaceWorker(ctx context.Context, old, new *Cluster) error {
	i := slices.Index(c.Workers, old)
	if i < 0 {
		return errors.New("pgcluster: replace of a cluster that is not a worker")
	}
	conn, err := pgx.Connect(ctx, c.Coordinator.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tag, err := conn.Exec(ctx, `SELECT citus_update_node(nodeid, $1, $2) FROM pg_dist_node
		WHERE nodename = $3 AND nodeport = $2`, new.dir, clusterPort, old.dir)
	if err != nil {
		return fmt.Errorf("pgcluster: citus_update_node: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("pgcluster: %d nodes at %s in pg_dist_node, want 1", tag.RowsAffected(), old.dir)
	}
	c.Workers[i] = new
	return nil
}

// Stop stops every node.
func (c *Citus) Stop() error {
	var errs []error
	for _, n := range append([]*Cluster{c.Coordinator}, c.Workers...) {
		if n != nil {
			errs = append(errs, n.Stop())
		}
	}
	return errors.Join(errs...)
}

// Exec runs stmt on a connection of its own to dsn, for the few
// administrative statements (CREATE EXTENSION, CREATE SCHEMA) a setup sends.
func Exec(ctx context.Context, dsn, stmt string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("pgcluster: %s: %w", stmt, err)
	}
	return nil
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
