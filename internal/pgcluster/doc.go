// Package pgcluster starts private, throwaway PostgreSQL servers from the
// server binaries installed on this machine, for tests and for demo programs
// run without a database URL.
//
//	c, err := pgcluster.Start(ctx)
//	if err != nil {
//		return err
//	}
//	defer c.Stop()
//	pool, err := pgxpool.New(ctx, c.DSN("postgres"))
//
// # Binaries
//
// [Start] runs initdb and postgres found side by side on PATH, in
// pg_config --bindir, or under /usr/lib/postgresql/*/bin or
// /usr/pgsql-*/bin, newest major version first; or, when the environment
// variable ATOMICPHASE_POSTGRES_BINDIR ([EnvBinDir]) names a directory, only
// there. [StartFrom] runs those of a directory the caller names, such as
// binaries a program downloaded. Running as root, either runs them as the
// OS user postgres, because both refuse to run as root.
//
// A [Cluster] listens only on a Unix socket in its own temporary directory,
// trusts every local connection as the superuser postgres, and runs with
// durability turned off ([SettingArgs]): its data is not meant to survive.
//
// # PgBouncer
//
// [StartBouncer] starts a private PgBouncer in transaction pooling mode in
// front of any server, a Cluster or another, from the pgbouncer program
// (Debian and Ubuntu: apt-get install pgbouncer). It listens only on a Unix
// socket in its own temporary directory, and opens a few server connections
// per database ([DefaultBouncerPoolSize]), so clients share them.
//
// # Replication
//
// [StartPrimary] starts a cluster that streams its WAL to standbys, and
// [StartStandby] starts a hot standby of it from a base backup
// (pg_basebackup, through a replication slot). Replication is asynchronous
// until [Cluster.SetSynchronous] makes every commit wait for a standby.
// Clients reach whichever cluster accepts writes through [MultiHostDSN],
// which lists every cluster's socket with target_session_attrs=read-write.
//
// A failover is [Cluster.Kill] on the primary, which kills its postmaster
// and backends at once as a crash of its machine would, and
// [Cluster.Promote] on a standby (pg_ctl promote). [Cluster.Rebuild] then
// turns the dead primary into a standby of the promoted one, in the same
// directory, so that the multi-host DSN keeps working for the next
// failover. [Cluster.Detach] cuts a standby off its primary, for tests that
// need a failover to lose commits for certain.
//
// A standby runs with its primary's settings, so any cluster can have one,
// a worker of [StartCitus] included (the standby loads citus as the worker
// does). A worker's failover is its Kill, its standby's Promote, and
// [Citus.ReplaceWorker], which points the coordinator at the promoted
// standby (citus_update_node). Commits wait for a standby only on a
// cluster started with synchronous_commit=on, as StartPrimary's are.
//
//	primary, _ := pgcluster.StartPrimary(ctx)
//	standby, _ := pgcluster.StartStandby(ctx, primary)
//	dsn := pgcluster.MultiHostDSN("postgres", primary, standby)
//	// ... traffic on dsn ...
//	_ = primary.Kill()
//	_ = standby.Promote(ctx) // dsn now reaches the standby
//	_ = primary.Rebuild(ctx, standby)
//
// # Cleanup
//
// [Cluster.Stop] and [Bouncer.Stop] shut the server or bouncer down and
// remove its directory. Neither outlives its owner for long even without
// them:
//
//   - The postmaster is started with a parent-death signal, so the kernel
//     kills it when the process that started it exits for any reason,
//     SIGKILL included, and its backends follow it. This needs Linux; on
//     other systems Start fails rather than leave servers running.
//     A bouncer gets the same signal.
//   - The directory of a cluster or bouncer whose owner died is removed by
//     the next call to Start or StartBouncer on the machine.
package pgcluster
