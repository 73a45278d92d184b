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
// # Cleanup
//
// [Cluster.Stop] shuts the server down and removes its directory. A cluster
// never outlives its owner for long even without it:
//
//   - The postmaster is started with a parent-death signal, so the kernel
//     kills it when the process that started it exits for any reason,
//     SIGKILL included, and its backends follow it. This needs Linux; on
//     other systems Start fails rather than leave servers running.
//   - The directory of a cluster whose owner died is removed by the next
//     call to Start on the machine.
package pgcluster
