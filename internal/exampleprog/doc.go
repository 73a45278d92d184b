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
// command's doc and flags, and parse them with Parse.
//
// # Database
//
// OpenDatabase connects to the -database-url flag's URL (DatabaseURL), or
// starts an embedded throwaway Postgres from the local server binaries when
// it is empty, and applies the program's schemas.
//
// # Serving
//
// Listen serves a handler in the background, for a demo that runs its
// servers and their clients in one process; Serve serves one until the
// program is told to stop. Both shut down gracefully.
package exampleprog
