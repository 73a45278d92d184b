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
// /usr/pgsql-*/bin, newest major version first. Running as root, it runs them
// as the OS user postgres, because both refuse to run as root.
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
