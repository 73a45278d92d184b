package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// clusterPort only names the socket file: clusters listen on no TCP
	// port, and each has its own socket directory, so they never collide.
	clusterPort = 5432

	// clusterDirPrefix starts the name of every cluster's temporary
	// directory, which is how sweepStaleClusters finds abandoned ones.
	clusterDirPrefix = "pgcluster-"

	// ownerFile holds the PID of the process that owns a cluster directory.
	ownerFile = "owner.pid"

	readyTimeout = 30 * time.Second
	readyPoll    = 20 * time.Millisecond
	stopTimeout  = 10 * time.Second
)

// SettingArgs returns the postgres command-line arguments (-c name=value)
// that every Cluster runs with, followed by extra settings, for other
// throwaway servers to run with too. Durability is off because the data is
// thrown away, and max_connections is high because parallel tests, some of
// which open more than a hundred connections each, share one server.
func SettingArgs(extra ...string) []string {
	settings := append([]string{
		"fsync=off",
		"full_page_writes=off",
		"synchronous_commit=off",
		"max_connections=300",
		"shared_buffers=64MB",
	}, extra...)
	var args []string
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	return args
}

// Cluster is a private PostgreSQL server started from local binaries. It
// listens only on a Unix socket in its own temporary directory, trusts every
// local connection as the superuser postgres, and is killed by the kernel
// when the process that started it exits, even by SIGKILL.
type Cluster struct {
	dir  string // socket directory; the data directory is dir/data
	bins binaries
	cred *syscall.Credential // nil unless running as root
	// settings are more -c settings for postgres, after SettingArgs.
	settings []string

	mu      sync.Mutex
	pm      *process // nil while stopped
	stopped bool
}

// Start initialises a new cluster in a temporary directory and starts it,
// returning once it accepts connections. Running as root, it runs initdb and
// postgres as the OS user postgres, because both refuse to run as root. It
// also removes the directories of clusters whose owners died without
// stopping them.
//
// settings are postgres settings ("name=value") applied after the
// package's own (durability off, see SettingArgs), which they override: a
// benchmark that measures durable commits passes "fsync=on",
// "synchronous_commit=on" and "full_page_writes=on".
func Start(ctx context.Context, settings ...string) (*Cluster, error) {
	return start(ctx, (*Cluster).init, settings)
}

// StartFrom starts a cluster as [Start] does, from the initdb and postgres
// in binDir instead of those Start would find, and without consulting
// EnvBinDir: for a program that brings its own server binaries, such as
// ones it downloaded. An error wrapping [ErrNoBinaries] means binDir lacks
// them.
func StartFrom(ctx context.Context, binDir string, settings ...string) (*Cluster, error) {
	bins, err := binariesAt(binDir)
	if err != nil {
		return nil, err
	}
	return startWith(ctx, bins, (*Cluster).init, settings)
}

// start makes a cluster directory, fills its data directory with create,
// and starts the server with settings, removing the directory if any step
// fails.
func start(ctx context.Context, create func(*Cluster, context.Context) error, settings []string) (*Cluster, error) {
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	return startWith(ctx, bins, create, settings)
}

// startWith is start with the server binaries bins.
func startWith(ctx context.Context, bins binaries, create func(*Cluster, context.Context) error, settings []string) (*Cluster, error) {
	cred, err := clusterCredential()
	if err != nil {
		return nil, err
	}
	sweepStaleClusters()

	dir, err := os.MkdirTemp("", clusterDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{dir: dir, bins: bins, cred: cred, settings: slices.Clone(settings)}
	if err := c.own(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := create(c, ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

// DSN returns a keyword/value connection string for database on the cluster.
func (c *Cluster) DSN(database string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s",
		quoteValue(c.dir), clusterPort, quoteValue(database))
}

// PID returns the process ID of the postmaster, or 0 when it is not running.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pm == nil {
		return 0
	}
	return c.pm.cmd.Process.Pid
}

// Restart shuts the server down (fast shutdown: open transactions are rolled
// back and every connection is closed) and starts it again on the same data
// directory and socket, returning once it accepts connections.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("pgcluster: restart of a stopped cluster")
	}
	if err := c.shutdown(); err != nil {
		return err
	}
	return c.start(ctx)
}

// Down shuts the server down (fast shutdown) and keeps its data: clients
// are refused until Up starts it again.
func (c *Cluster) Down() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shutdown()
}

// Up starts a server that Down shut down, on the same data directory and
// socket, returning once it accepts connections.
func (c *Cluster) Up(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.mayReuse("start"); err != nil {
		return err
	}
	return c.start(ctx)
}

// mayReuse reports why what (start, rebuild) may not be done with c: it
// must be shut down, and not stopped. c.mu is held.
func (c *Cluster) mayReuse(what string) error {
	switch {
	case c.stopped:
		return fmt.Errorf("pgcluster: %s of a stopped cluster", what)
	case c.pm != nil:
		return fmt.Errorf("pgcluster: %s of a running cluster; shut it down first", what)
	}
	return nil
}

// Host is the directory of the server's socket: its host in a connection
// string, and its node name in a Citus cluster.
func (c *Cluster) Host() string { return c.dir }

// Stop shuts the server down and removes its directory. Calling it again
// does nothing.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	err := c.shutdown()
	if rmErr := os.RemoveAll(c.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("pgcluster: %w", rmErr))
	}
	return err
}

// BinDir returns the directory of the server binaries c runs.
func (c *Cluster) BinDir() string { return filepath.Dir(c.bins.postgres) }

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) logPath() string { return filepath.Join(c.dir, "postgres.log") }

// own writes the owner file and hands the directory to the cluster's user.
func (c *Cluster) own() error {
	if err := os.WriteFile(filepath.Join(c.dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		// The postgres user creates the data directory and the socket here.
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	return nil
}

// init runs initdb.
func (c *Cluster) init(ctx context.Context) error {
	var out bytes.Buffer
	cmd := exec.Command(c.bins.initdb,
		"-D", c.dataDir(),
		"-A", "trust",
		"-U", "postgres",
		"-E", "UTF8",
		"--locale=C",
		"--no-sync",
	)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := c.run(ctx, cmd); err != nil {
		return fmt.Errorf("pgcluster: initdb: %w\n%s", err, out.Bytes())
	}
	return nil
}

// run runs cmd as the cluster's user and waits for it, killing it if ctx
// ends first.
func (c *Cluster) run(ctx context.Context, cmd *exec.Cmd) error {
	c.prepare(cmd)
	p, err := startProcess(cmd)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		_ = p.cmd.Process.Kill()
		<-p.done
		return ctx.Err()
	}
}

// prepare makes cmd run as the cluster's user, from a directory that user
// can read: the caller's working directory may be closed to it.
func (c *Cluster) prepare(cmd *exec.Cmd) {
	cmd.Dir = c.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
}

// start starts the postmaster and waits until it accepts connections.
func (c *Cluster) start(ctx context.Context) error {
	// Appending keeps the log of earlier runs, which is what explains a
	// failed restart. The file is passed as the child's stderr itself, not
	// through a pipe, so backends can keep writing after the postmaster dies.
	logFile, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer logFile.Close()

	args := append([]string{"-D", c.dataDir(), "-p", strconv.Itoa(clusterPort)},
		SettingArgs(append([]string{"listen_addresses=", "unix_socket_directories=" + c.dir}, c.settings...)...)...)
	cmd := exec.Command(c.bins.postgres, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	c.prepare(cmd)
	p, err := startProcess(cmd)
	if err != nil {
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	c.pm = p
	if err := p.waitReady(ctx, "postgres", c.DSN("postgres"), c.logPath()); err != nil {
		_ = c.shutdown()
		return err
	}
	return nil
}

// ping connects to dsn once, giving up after a second.
func ping(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// shutdown stops the postmaster with a fast shutdown, killing it if it takes
// longer than stopTimeout.
func (c *Cluster) shutdown() error {
	p := c.pm
	if p == nil {
		return nil
	}
	c.pm = nil
	// SIGINT asks for a fast shutdown: it does not wait for clients to
	// disconnect, as the default smart shutdown would.
	return p.stop(os.Interrupt, "postgres", c.logPath())
}

// binaries are the paths of the server programs a Cluster runs.
type binaries struct {
	initdb, postgres string
}

// ErrNoBinaries is returned, wrapped, by [Start] and the other starts when
// they find no initdb and postgres to run, so that a program can get the
// server some other way.
var ErrNoBinaries = errors.New("no PostgreSQL server binaries")

// EnvBinDir names the environment variable holding the directory of the
// PostgreSQL server binaries to run (initdb and postgres, side by side).
// When it is set, [Start] looks nowhere else, so that one of several
// installed versions can be chosen, or the local binaries hidden by naming
// a directory without them.
const EnvBinDir = "ATOMICPHASE_POSTGRES_BINDIR"

// findBinaries looks for initdb and postgres side by side: in the directory
// EnvBinDir names when it is set, or else on PATH, in pg_config --bindir,
// and in the versioned directories Debian and Red Hat packages install them
// to without putting them on PATH.
func findBinaries() (binaries, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		b, err := binariesAt(dir)
		if err != nil {
			return binaries{}, fmt.Errorf("%w, which %s names", err, EnvBinDir)
		}
		return b, nil
	}
	var dirs []string
	if path, err := exec.LookPath("postgres"); err == nil {
		dirs = append(dirs, filepath.Dir(path))
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"} {
		matches, _ := filepath.Glob(pattern)
		// Newest major version first.
		slices.SortFunc(matches, func(a, b string) int { return majorVersion(b) - majorVersion(a) })
		dirs = append(dirs, matches...)
	}
	for _, dir := range dirs {
		b := binariesIn(dir)
		if isExecutable(b.initdb) && isExecutable(b.postgres) {
			return b, nil
		}
	}
	return binaries{}, fmt.Errorf("pgcluster: %w: initdb and postgres not found on PATH, in pg_config --bindir, or under /usr/lib/postgresql", ErrNoBinaries)
}

func binariesIn(dir string) binaries {
	return binaries{initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
}

// binariesAt returns the binaries in dir, or an error wrapping
// ErrNoBinaries when they are not both there.
func binariesAt(dir string) (binaries, error) {
	b := binariesIn(dir)
	if !isExecutable(b.initdb) || !isExecutable(b.postgres) {
		return binaries{}, fmt.Errorf("pgcluster: %w: initdb and postgres not found in %s", ErrNoBinaries, dir)
	}
	return b, nil
}

// majorVersion returns the major version in a path such as
// /usr/lib/postgresql/15/bin or /usr/pgsql-9.6/bin, or 0.
func majorVersion(dir string) int {
	name := filepath.Base(filepath.Dir(dir))
	name = strings.TrimPrefix(name, "pgsql-")
	major, _, _ := strings.Cut(name, ".")
	n, _ := strconv.Atoi(major)
	return n
}

func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0
}

// clusterCredential returns the user to run the server as: nil (the current
// user) unless running as root, which initdb and postgres refuse to run as.
func clusterCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root, and there is no postgres OS user to run initdb and postgres as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: uid of postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: gid of postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// sweepStaleClusters removes the directories of clusters whose owner died
// without stopping them. Their postmasters are already gone, killed by the
// parent-death signal, but their directories would pile up in the temporary
// directory, tens of megabytes each.
func sweepStaleClusters() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), clusterDirPrefix+"*"))
	for _, dir := range dirs {
		if !abandoned(dir) {
			continue
		}
		_ = os.RemoveAll(dir)
	}
}

// abandoned reports whether dir belongs to a dead owner and no postmaster
// runs in it. A directory without a readable owner file is either still
// being created or not a cluster's, so it is left alone.
func abandoned(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return false
	}
	owner, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || processAlive(owner) {
		return false
	}
	// The first line of postmaster.pid is the postmaster's PID; a cluster
	// being shut down right now still has it.
	if b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && processAlive(pid) {
			return false
		}
	}
	return true
}

// quoteValue quotes a keyword/value connection string value when it needs
// it.
func quoteValue(v string) string {
	if v != "" && !strings.ContainsAny(v, ` '\`) {
		return v
	}
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return "'" + r.Replace(v) + "'"
}
