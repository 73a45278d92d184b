package pgcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func startCluster(t *testing.T) *Cluster {
	t.Helper()
	c, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func TestClusterRestartKeepsData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := startCluster(t)

	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE survivor (id int); INSERT INTO survivor VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	before := c.PID()
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	after := c.PID()
	if after == before || after == 0 {
		t.Errorf("postmaster PID %d after restart, was %d", after, before)
	}
	if processAlive(before) {
		t.Errorf("old postmaster %d still runs after restart", before)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("connection from before the restart still works")
	}
	conn.Close(ctx)

	conn, err = pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		t.Fatalf("connect after restart: %v", err)
	}
	defer conn.Close(ctx)
	var id int
	if err := conn.QueryRow(ctx, "SELECT id FROM survivor").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if id != 42 {
		t.Errorf("survivor id = %d after restart, want 42", id)
	}
}

// TestStartFailureShowsTheServerLog checks that a server that cannot start
// says why, in its own words.
func TestStartFailureShowsTheServerLog(t *testing.T) {
	t.Parallel()
	c, err := Start(context.Background(), "no_such_setting=1")
	if err == nil {
		c.Stop()
		t.Fatal("Start with an unknown setting succeeded")
	}
	for _, want := range []string{"postgres exited during startup", `unrecognized configuration parameter "no_such_setting"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error does not say %q:\n%v", want, err)
		}
	}
}

func TestClusterStopRemovesEverything(t *testing.T) {
	t.Parallel()
	c, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pid := c.PID()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if processAlive(pid) {
		t.Errorf("postmaster %d still runs after Stop", pid)
	}
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		t.Errorf("cluster directory %s still exists after Stop (stat: %v)", c.dir, err)
	}
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := c.Restart(context.Background()); err == nil {
		t.Error("Restart after Stop succeeded")
	}
}

// TestBinDirIsTheOnlyPlaceLooked checks that a directory named by EnvBinDir
// without the server binaries fails Start, even though binaries are
// installed elsewhere on the machine, and that the error names the variable.
func TestBinDirIsTheOnlyPlaceLooked(t *testing.T) {
	t.Setenv(EnvBinDir, t.TempDir())
	c, err := Start(context.Background())
	if err == nil {
		c.Stop()
		t.Fatalf("Start with %s naming an empty directory succeeded", EnvBinDir)
	}
	if !strings.Contains(err.Error(), EnvBinDir) {
		t.Errorf("Start error does not name %s: %v", EnvBinDir, err)
	}
}

// TestBinDirChoosesTheBinaries checks that a cluster runs the initdb and
// postgres of the directory EnvBinDir names.
func TestBinDirChoosesTheBinaries(t *testing.T) {
	dir := linkedBinaries(t)
	t.Setenv(EnvBinDir, dir)
	c := startCluster(t)
	if want := filepath.Join(dir, "postgres"); c.bins.postgres != want {
		t.Errorf("cluster runs %s, want %s", c.bins.postgres, want)
	}
	pingCluster(t, c)
}

// TestStartFromRunsTheGivenBinariesWhateverBinDirSays checks that StartFrom
// runs the binaries of the directory it is given, even when EnvBinDir names
// another, and that a directory without them fails it with ErrNoBinaries.
func TestStartFromRunsTheGivenBinariesWhateverBinDirSays(t *testing.T) {
	dir := linkedBinaries(t)
	t.Setenv(EnvBinDir, t.TempDir())
	c, err := StartFrom(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	if want := filepath.Join(dir, "postgres"); c.bins.postgres != want {
		t.Errorf("cluster runs %s, want %s", c.bins.postgres, want)
	}
	pingCluster(t, c)

	empty := t.TempDir()
	if c, err := StartFrom(context.Background(), empty); !errors.Is(err, ErrNoBinaries) {
		if err == nil {
			c.Stop()
		}
		t.Errorf("StartFrom(%s) = %v, want ErrNoBinaries", empty, err)
	}
}

// linkedBinaries returns a directory of links to the initdb and postgres
// that Start finds, readable by the postgres OS user that the server runs
// as under root.
func linkedBinaries(t *testing.T) string {
	t.Helper()
	found, err := findBinaries()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pgcluster-bindir-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{found.initdb, found.postgres} {
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, filepath.Base(path))); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// pingCluster connects to c's postgres database and pings it.
func pingCluster(t *testing.T, c *Cluster) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.Ping(context.Background()); err != nil {
		t.Error(err)
	}
}

// helperEnv makes the test binary run TestHelperProcess as a cluster owner
// that TestClusterDiesWithKilledOwner kills.
const helperEnv = "PGCLUSTER_HELPER_PROCESS"

func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	c, err := Start(context.Background())
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	b, err := StartBouncer(context.Background(), BouncerConfig{Server: c.DSN("postgres")})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Println("CLUSTER", c.PID(), c.dir)
	fmt.Println("BOUNCER", b.PID(), b.dir)
	time.Sleep(time.Minute)
	os.Exit(1)
}

func TestClusterAndBouncerDieWithKilledOwner(t *testing.T) {
	t.Parallel()
	needBouncer(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	lines := make(chan string)
	go func() {
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
		close(lines)
	}()
	// The postmaster and the bouncer, by the word the helper prints.
	pids, dirs := map[string]int{}, map[string]string{}
	for len(pids) < 2 {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("helper exited without starting a cluster and a bouncer")
			}
			if rest, ok := strings.CutPrefix(line, "ERROR "); ok {
				t.Fatalf("helper: %s", rest)
			}
			fields := strings.Fields(line)
			if len(fields) == 3 && (fields[0] == "CLUSTER" || fields[0] == "BOUNCER") {
				pids[fields[0]], _ = strconv.Atoi(fields[1])
				dirs[fields[0]] = fields[2]
			}
		case <-time.After(time.Minute):
			t.Fatal("helper did not start a cluster and a bouncer within a minute")
		}
	}
	for what, pid := range pids {
		if !processAlive(pid) {
			t.Fatalf("%s %d is not running before its owner is killed", what, pid)
		}
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for what, pid := range pids {
		for processAlive(pid) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("%s %d still runs 5s after its owner was killed", what, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	sweepStaleClusters()
	for what, dir := range dirs {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("sweep left the killed owner's %s directory %s (stat: %v)", what, dir, err)
			os.RemoveAll(dir)
		}
	}
}

func TestDSNQuotesPaths(t *testing.T) {
	t.Parallel()
	c := &Cluster{dir: `/tmp/it's a dir`}
	config, err := pgx.ParseConfig(c.DSN("my db"))
	if err != nil {
		t.Fatal(err)
	}
	if config.Host != c.dir || config.Database != "my db" || config.User != "postgres" {
		t.Errorf("DSN %q parses to host %q, database %q, user %q", c.DSN("my db"), config.Host, config.Database, config.User)
	}
}
