package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// bouncerPort only names the socket file: a Bouncer listens on no TCP
	// port, and each has its own socket directory.
	bouncerPort = 6432

	// DefaultBouncerPoolSize is how many server connections a Bouncer opens
	// at most for each database: few, so that clients share them and every
	// transaction may run on another server connection than the last.
	DefaultBouncerPoolSize = 8
)

// BouncerConfig says what a Bouncer pools.
type BouncerConfig struct {
	// Server is the DSN of the PostgreSQL server behind the bouncer: its
	// host, port, user and password are used (a password from PGPASSWORD or
	// the password file too), and TLS when it asks for TLS. Its database is
	// not: clients name theirs, and reach the database of that name.
	Server string
	// PoolSize is how many server connections the bouncer opens at most for
	// each database. Defaults to DefaultBouncerPoolSize.
	PoolSize int
	// SessionPooling makes the bouncer give each client a server session of
	// its own for as long as it stays connected (pool_mode = session),
	// instead of for each transaction.
	SessionPooling bool
}

// Bouncer is a private PgBouncer, in transaction pooling mode unless
// configured otherwise: each transaction of a client, and each statement
// outside a transaction, runs on whichever server connection of the
// database's pool is free, so nothing a client leaves on a server session
// (a prepared statement, a SET, a LISTEN) follows it to its next
// transaction.
//
// It listens only on a Unix socket in its own temporary directory and lets
// every local client in under any user name, logging in to the server as
// the user of BouncerConfig.Server. Like a Cluster, it runs as the OS user
// postgres when started by root, and the kernel kills it when the process
// that started it exits.
type Bouncer struct {
	dir  string
	bin  string
	cred *syscall.Credential

	mu      sync.Mutex
	p       *process // nil once stopped
	stopped bool
}

// StartBouncer starts a Bouncer in front of cfg.Server and returns once it
// accepts connections. It needs the pgbouncer program (Debian and Ubuntu:
// apt-get install pgbouncer).
func StartBouncer(ctx context.Context, cfg BouncerConfig) (*Bouncer, error) {
	server, err := pgconn.ParseConfig(cfg.Server)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: bouncer server DSN: %w", err)
	}
	bin, err := findBouncer()
	if err != nil {
		return nil, err
	}
	cred, err := clusterCredential()
	if err != nil {
		return nil, err
	}
	sweepStaleClusters()

	// The prefix makes sweepStaleClusters remove it once its owner is dead.
	dir, err := os.MkdirTemp("", clusterDirPrefix+"bouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	b := &Bouncer{dir: dir, bin: bin, cred: cred}
	if err := b.configure(server, cfg); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

// DSN returns a keyword/value connection string for database through the
// bouncer.
func (b *Bouncer) DSN(database string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s",
		quoteValue(b.dir), bouncerPort, quoteValue(database))
}

// AdminDSN returns the connection string of the bouncer's admin console
// (SHOW POOLS, SHOW SERVERS...). The console speaks only the simple query
// protocol, which the DSN asks pgx to use.
func (b *Bouncer) AdminDSN() string {
	return b.DSN("pgbouncer") + " default_query_exec_mode=simple_protocol"
}

// PID returns the process ID of the bouncer, or 0 once it is stopped.
func (b *Bouncer) PID() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.p == nil {
		return 0
	}
	return b.p.cmd.Process.Pid
}

// Stop shuts the bouncer down, closing every client and server connection
// at once, and removes its directory. Calling it again does nothing.
func (b *Bouncer) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return nil
	}
	b.stopped = true
	err := b.shutdown()
	if rmErr := os.RemoveAll(b.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("pgcluster: %w", rmErr))
	}
	return err
}

func (b *Bouncer) iniPath() string { return filepath.Join(b.dir, "pgbouncer.ini") }
func (b *Bouncer) logPath() string { return filepath.Join(b.dir, "pgbouncer.log") }

// configure writes the owner file and the bouncer's configuration.
func (b *Bouncer) configure(server *pgconn.Config, cfg BouncerConfig) error {
	poolSize := cfg.PoolSize
	if poolSize <= 0 {
		poolSize = DefaultBouncerPoolSize
	}
	poolMode := "transaction"
	if cfg.SessionPooling {
		poolMode = "session"
	}
	if err := os.WriteFile(filepath.Join(b.dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	conn := []string{
		"host=" + bouncerValue(server.Host),
		"port=" + strconv.Itoa(int(server.Port)),
		"user=" + bouncerValue(server.User),
	}
	if server.Password != "" {
		conn = append(conn, "password="+bouncerValue(server.Password))
	}
	tlsMode := "disable"
	if server.TLSConfig != nil && !strings.HasPrefix(server.Host, "/") {
		tlsMode = "require"
		for _, fb := range server.Fallbacks {
			if fb.TLSConfig == nil {
				tlsMode = "prefer"
			}
		}
	}
	ini := fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
unix_socket_dir = %s
listen_port = %d
pool_mode = %s
default_pool_size = %d
max_client_conn = 5000
auth_type = any
server_tls_sslmode = %s
server_login_retry = 1
log_connections = 0
log_disconnections = 0
`, strings.Join(conn, " "), b.dir, bouncerPort, poolMode, poolSize, tlsMode)
	// 0600: it may hold the server's password.
	if err := os.WriteFile(b.iniPath(), []byte(ini), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if b.cred != nil {
		for _, path := range []string{b.dir, b.iniPath()} {
			if err := os.Chown(path, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
				return fmt.Errorf("pgcluster: %w", err)
			}
		}
	}
	return nil
}

// start starts pgbouncer and waits until it accepts connections.
func (b *Bouncer) start(ctx context.Context) error {
	logFile, err := os.OpenFile(b.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(b.bin, b.iniPath())
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = b.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	p, err := startProcess(cmd)
	if err != nil {
		return fmt.Errorf("pgcluster: start pgbouncer: %w", err)
	}
	b.p = p
	if err := p.waitReady(ctx, "pgbouncer", b.AdminDSN(), b.logPath()); err != nil {
		_ = b.shutdown()
		return err
	}
	return nil
}

// shutdown stops pgbouncer at once (SIGTERM: no waiting for clients to
// finish their transactions), killing it if it takes longer than
// stopTimeout.
func (b *Bouncer) shutdown() error {
	p := b.p
	if p == nil {
		return nil
	}
	b.p = nil
	return p.stop(syscall.SIGTERM, "pgbouncer", b.logPath())
}

// ErrNoBouncer is returned by StartBouncer when the pgbouncer program is
// not installed.
var ErrNoBouncer = errors.New("pgcluster: pgbouncer not found on PATH or in /usr/sbin; install it (Debian and Ubuntu: apt-get install pgbouncer; .ci/run installs it)")

// findBouncer looks for pgbouncer on PATH and where packages install it
// off the PATH of users other than root.
func findBouncer() (string, error) {
	if path, err := exec.LookPath("pgbouncer"); err == nil {
		return path, nil
	}
	for _, path := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if isExecutable(path) {
			return path, nil
		}
	}
	return "", ErrNoBouncer
}

// bouncerValue quotes a value of a pgbouncer connection string when it
// needs it: pgbouncer reads values in single quotes, a quote doubled.
func bouncerValue(v string) string {
	if v != "" && !strings.ContainsAny(v, ` '"\=`) {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}
