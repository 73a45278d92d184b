package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// replicationSettings are the settings of every cluster made by
// StartPrimary and StartStandby, so that a standby, once promoted, can feed
// standbys of its own.
var replicationSettings = []string{
	"wal_level=replica",
	"max_wal_senders=10",
	"max_replication_slots=10",
	"hot_standby=on",
	// SettingArgs turns this off, which would let a commit return before
	// its WAL is written and so before a standby can have it. On, a
	// failover to an asynchronous standby loses only what had not reached
	// the standby, as in production, and synchronous_standby_names can
	// make commits wait for a standby.
	"synchronous_commit=on",
	// A standby that lost its primary waits this long between attempts to
	// find WAL, and PostgreSQL 15 finishes such a wait before it acts on a
	// promotion: the default, 5s, would add up to 5s to every failover.
	"wal_retrieve_retry_interval=100ms",
}

// replicationTimeout bounds the wait for a standby to stream, for a
// promotion and for a setting to take effect.
const replicationTimeout = time.Minute

// StartPrimary starts a new cluster, as Start does, that standbys made by
// StartStandby can replicate from. It replicates asynchronously until
// SetSynchronous says otherwise.
func StartPrimary(ctx context.Context) (*Cluster, error) {
	return start(ctx, (*Cluster).init, replicationSettings)
}

// StartStandby starts a new cluster as a streaming standby of primary: a
// base backup of primary, taken through a replication slot of its own on
// primary, and started in hot standby, so it accepts read-only sessions. It
// runs with primary's settings, so that once promoted it serves as primary
// did (a standby of a [Citus] worker loads the citus extension), and with
// those of replication. It returns once the standby streams from primary.
// Promote makes it a primary.
func StartStandby(ctx context.Context, primary *Cluster) (*Cluster, error) {
	c, err := start(ctx, func(c *Cluster, ctx context.Context) error { return c.baseBackup(ctx, primary) }, primary.standbySettings())
	if err != nil {
		return nil, err
	}
	if err := c.waitStreaming(ctx); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

// Rebuild makes the cluster, whose server must not be running (see Kill),
// a new streaming standby of primary in the same directory, so it keeps
// its DSN: its data is replaced by a base backup of primary, and its
// settings by primary's, as StartStandby sets them. This is how a failed
// primary rejoins as the standby of the one that replaced it.
func (c *Cluster) Rebuild(ctx context.Context, primary *Cluster) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.mayReuse("rebuild"); err != nil {
		return err
	}
	// The data directory belongs to the cluster's user, which may be
	// another than this process's, but root can remove it.
	if err := os.RemoveAll(c.dataDir()); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	c.settings = primary.standbySettings()
	if err := c.baseBackup(ctx, primary); err != nil {
		return err
	}
	if err := c.start(ctx); err != nil {
		return err
	}
	return c.waitStreaming(ctx)
}

// standbySettings returns the settings of a standby of the cluster: its
// own, with replicationSettings in place of any it sets again. Settings are
// command-line arguments of the postmaster, which a base backup does not
// copy: without the citus extension loaded, for one, a standby of a Citus
// node does not start, its max_prepared_transactions below the primary's.
func (c *Cluster) standbySettings() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	replaced := func(s string) bool {
		name, _, _ := strings.Cut(s, "=")
		return slices.ContainsFunc(replicationSettings, func(r string) bool { return strings.HasPrefix(r, name+"=") })
	}
	return append(slices.DeleteFunc(slices.Clone(c.settings), replaced), replicationSettings...)
}

// baseBackup fills the empty data directory with a base backup of
// primary, set up to stream from it through a new replication slot named
// after the cluster's directory.
func (c *Cluster) baseBackup(ctx context.Context, primary *Cluster) error {
	var out bytes.Buffer
	cmd := exec.Command(c.bin("pg_basebackup"),
		"-D", c.dataDir(),
		"-d", primary.DSN("postgres"),
		// A fast checkpoint starts the backup now rather than after a
		// spread checkpoint, which takes minutes.
		"--checkpoint=fast",
		"--wal-method=stream",
		"--write-recovery-conf",
		"--create-slot", "--slot", c.slotName(),
		"--no-sync",
	)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := c.run(ctx, cmd); err != nil {
		return fmt.Errorf("pgcluster: pg_basebackup: %w\n%s", err, out.Bytes())
	}
	// The backup carries the primary's postgresql.auto.conf. A standby
	// waits for no standby of its own: once promoted it commits alone
	// until SetSynchronous is called on it.
	f, err := os.OpenFile(filepath.Join(c.dataDir(), "postgresql.auto.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_, err = f.WriteString("synchronous_standby_names = ''\n")
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// slotName is the name of the replication slot the cluster streams
// through: its directory's name, in the characters a slot name allows.
func (c *Cluster) slotName() string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(filepath.Base(c.dir)))
}

// bin returns the path of the server program name, beside postgres in the
// directory of the installation, which a postgres on PATH may only link to.
func (c *Cluster) bin(name string) string {
	postgres, err := filepath.EvalSymlinks(c.bins.postgres)
	if err != nil {
		postgres = c.bins.postgres
	}
	return filepath.Join(filepath.Dir(postgres), name)
}

// waitStreaming waits until the standby's WAL receiver streams.
func (c *Cluster) waitStreaming(ctx context.Context) error {
	return c.poll(ctx, "the standby to stream from its primary",
		`SELECT count(*) > 0 FROM pg_stat_wal_receiver WHERE status = 'streaming'`)
}

// CatchUp waits until the standby has replayed all the WAL that primary
// had written when it was called, so that a promotion from then on keeps
// every commit made so far.
func (c *Cluster) CatchUp(ctx context.Context, primary *Cluster) error {
	conn, err := pgx.Connect(ctx, primary.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	var lsn string
	err = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return c.poll(ctx, "the standby to replay up to "+lsn, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn)
}

// poll runs the query, which returns one boolean, until it returns true.
func (c *Cluster) poll(ctx context.Context, what, query string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, replicationTimeout)
	defer cancel()
	var last error
	for {
		conn, err := pgx.Connect(ctx, c.DSN("postgres"))
		if err == nil {
			var done bool
			err = conn.QueryRow(ctx, query, args...).Scan(&done)
			conn.Close(ctx)
			if err == nil && done {
				return nil
			}
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: waiting for %s: %w (last error: %v); log:\n%s", what, ctx.Err(), last, logTail(c.logPath()))
		case <-time.After(readyPoll):
		}
	}
}

// SetSynchronous makes every commit on the cluster, a primary, wait until
// a standby has flushed it (synchronous_standby_names = '*'), or stops
// waiting. Turning it on returns once a standby is synchronous; until one
// is, commits would hang. It refuses a cluster whose commits wait for no
// standby whatever it sets, such as one of [Start], which runs with
// synchronous_commit=off unless told otherwise.
func (c *Cluster) SetSynchronous(ctx context.Context, on bool) error {
	names := "''"
	if on {
		names = "'*'"
	}
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(ctx)
	if on {
		var commit string
		if err := conn.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&commit); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		if commit == "off" || commit == "local" {
			return fmt.Errorf("pgcluster: with synchronous_commit=%s commits wait for no standby; start the cluster with synchronous_commit=on", commit)
		}
	}
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+names); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	// The reload reaches the server's processes asynchronously; a new
	// session sees the setting once the postmaster has read it, and the
	// WAL sender reports a synchronous standby once it has too.
	query := `SELECT current_setting('synchronous_standby_names') = ''`
	if on {
		query = `SELECT current_setting('synchronous_standby_names') = '*'
			AND EXISTS (SELECT FROM pg_stat_replication WHERE sync_state = 'sync')`
	}
	return c.poll(ctx, "synchronous_standby_names to take effect", query)
}

// Detach stops the standby's WAL receiver, so that the standby receives
// nothing more from its primary, which goes on committing if it is
// asynchronous: what it commits from then on is lost if the standby is
// promoted. It is how a test makes a failover lose commits for certain.
func (c *Cluster) Detach(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(ctx)
	// ALTER SYSTEM writes a file and no WAL, so a standby runs it.
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''"); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return c.poll(ctx, "the WAL receiver to stop", `SELECT NOT EXISTS (SELECT FROM pg_stat_wal_receiver)`)
}

// Promote makes the standby a primary (pg_ctl promote) and returns once it
// accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pm == nil {
		return errors.New("pgcluster: promote of a cluster that is not running")
	}
	var out bytes.Buffer
	cmd := exec.Command(c.bin("pg_ctl"), "promote", "-D", c.dataDir(), "-w", "-t", fmt.Sprint(int(replicationTimeout.Seconds())))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := c.run(ctx, cmd); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl promote: %w\n%s", err, out.Bytes())
	}
	return c.poll(ctx, "the promoted standby to accept writes", `SELECT NOT pg_is_in_recovery()`)
}

// Kill kills the server as a crash of its machine would: the postmaster
// and every backend at once, with SIGKILL, so nothing is written or sent
// after it. Its socket stays behind and refuses connections. Rebuild makes
// it a standby again; Stop removes it.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pm
	if p == nil {
		return errors.New("pgcluster: kill of a cluster that is not running")
	}
	c.pm = nil
	pid := p.cmd.Process.Pid
	// Stopped, the postmaster can start no new process while its children
	// are listed and killed; once it dies they would be reparented and no
	// longer be found as its children.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pgcluster: stop postmaster: %w", err)
	}
	for _, child := range children(pid) {
		_ = syscall.Kill(child, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-p.done
	return nil
}

// children returns the processes whose parent is pid.
func children(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// The parent follows the state, after the command name, which is
		// in parentheses and may itself contain spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		var state string
		var ppid, self int
		if _, err := fmt.Sscanf(string(b[i+1:]), " %s %d", &state, &ppid); err != nil || ppid != pid {
			continue
		}
		if _, err := fmt.Sscanf(string(b), "%d", &self); err == nil {
			out = append(out, self)
		}
	}
	return out
}

// MultiHostDSN returns a connection string for database on the first of
// the clusters that accepts writes (target_session_attrs=read-write), as
// an application in front of a primary and its standbys connects: after a
// failover, new connections find the promoted standby.
func MultiHostDSN(database string, clusters ...*Cluster) string {
	hosts := make([]string, len(clusters))
	for i, c := range clusters {
		hosts[i] = c.dir
	}
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s target_session_attrs=read-write",
		quoteValue(strings.Join(hosts, ",")), clusterPort, quoteValue(database))
}
