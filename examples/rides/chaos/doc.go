// Package chaos runs the rides example as real processes, breaks them, or
// fails their database over to a standby, while riders keep retrying, and
// then checks that every ride was charged at most once and every key got
// one answer. It holds only tests.
//
// # Setup
//
// Each test runs on a database of its own: TestChaosKillsAndTerminatedSessions
// on the server every test uses (ATOMICPHASE_TEST_DATABASE_URL, Docker or
// local binaries, see internal/pgtest), TestChaosPostgresRestart on a
// private cluster, so that restarting it disturbs no other test, and the
// failover tests on a private primary and standby (see Failover); these
// need the PostgreSQL server binaries (initdb, postgres, pg_basebackup and
// pg_ctl) even when ATOMICPHASE_TEST_DATABASE_URL is set. Each starts one
// `rides fakestripe` process whose fault plan fails some charges before
// they execute and drops the connection after others, and three `rides
// serve` processes on one database with a two-second lease and a
// completer that runs every half second. Riders from
// examples/rides/sim send each ride, sometimes as several concurrent copies,
// to API processes picked at random per attempt, and retry with the same
// Idempotency-Key through package caller (a dropped connection, a 409, a
// 503, a 500, a first 502), until a final answer (201, 402 or 502) or until
// they give up and leave the key to the completer.
//
// # Chaos
//
// In the tests without replication, while the riders ride, every 200 to
// 500 ms one API process is killed with SIGKILL and started again on its
// address (a start that meets a terminated session or a Postgres that is
// down exits, and is tried again); every 300 ms two random application
// sessions are ended with pg_terminate_backend; and in
// TestChaosPostgresRestart Postgres itself is restarted halfway through
// (once a minute in a soak).
//
// The processes must survive all of this: pgxpool and River reconnect, and
// requests fail closed with 503 meanwhile. A process that exits on its own
// fails the test, and at each Postgres restart one API process is spared
// from kills until it has served a new ride, so that surviving the restart
// is shown rather than left to fresh processes.
//
// # Invariants
//
// When the riders are done the chaos stops, the fault plan is cleared, and
// a completer runs until no key is left to finish. Keys the completers gave
// up on after too many attempts (the dead hold) are retried as an operator
// would, with phase.Client.Retry. Then ride.Verify must find: every key
// finished and none locked, as many charges at Stripe as rides recording a
// charge, no ride charged twice, no charge without its ride, every 201
// backed by a charge; and no key may have been answered two different final
// responses. When an invariant fails, the test logs the keys and charges
// behind it and keeps the processes' logs. Each test logs a summary (go
// test -v): kills, terminated sessions, Postgres restarts, requests and
// their outcomes, and the invariants.
//
// Receipts are counted but not checked against created rides: a receipt
// job running in a killed process stays running until River rescues it,
// 15 seconds later (see ride.New), and the tests do not wait for that.
//
// # Failover
//
// TestFailoverSynchronous and TestFailoverAsynchronous put the rides
// database on a primary and a streaming standby (internal/pgcluster: a base
// backup with pg_basebackup, through a replication slot), which the API
// processes reach through one multi-host connection string with
// target_session_attrs=read-write. The fake Stripe keeps its data on the
// server every test uses, which never fails over: it plays another
// company's system, whose memory of idempotency keys outlives our failover.
//
// Twice during the traffic the primary is killed as a crash of its machine
// would kill it (SIGKILL of the postmaster and every backend at once) and
// the standby is promoted with pg_ctl promote. Between the two failovers
// the dead primary is rebuilt as the standby of the new one, and
// replication is made synchronous again in the synchronous test. In the asynchronous test the
// second failover first cuts the standby off its primary for a second, as
// a standby that falls behind would be, so that acknowledged rides are
// lost for certain; the first finds the standby streaming. The API
// processes are neither killed nor cut off: they must live through each
// failover, pgxpool and River reconnecting, and each must serve a ride
// again within 20 seconds.
//
// Right after each promotion the test counts the rides answered 201 whose
// ride the promoted standby lacks. With synchronous replication there must
// be none. With asynchronous replication the lost rides are counted; once
// the traffic is over, their riders retry them with the same key and
// request, each must be answered 201 again (a new ride, since the first
// was lost with its key row), and every invariant above must hold,
// including one charge per ride request: the retry sends the same Stripe
// idempotency key with the same parameters, and Stripe answers with the
// first charge. Such a key is the only one allowed to be answered two
// different final responses. TestFailoverRetryAfterLostCommitsChargesOnce
// shows the same for one key, step by step.
//
// # Citus
//
// TestChaosCitusWorkerKilledMidCharge puts the rides database on a Citus
// cluster of its own (internal/pgcluster: a coordinator and two workers),
// distributed by tenant as `rides serve -citus` does it, with two API
// processes on the coordinator and riders on both workers. The fake Stripe
// keeps its data on the server every test uses and only slows charges
// down, so that every failed answer is the outage's. The nodes commit
// synchronously (the other tests' servers do not): a node killed with
// asynchronous commits loses commits it acknowledged, which no client can
// make up for. Once a charge of a
// rider on the worker holding the busiest rider's keys is in flight, that
// worker is killed as a crash of its machine would kill it and started
// again five seconds later; meanwhile one API process is killed and
// started again, and a new ride is sent every 200 ms, once, for a rider of
// each worker. Besides the invariants above, the restarted API process
// must start at its first try and serve the other worker's riders, who
// must be served while the node is down, and the killed node's riders
// within 20 seconds of its restart; the summary gives the answers each got
// and the time to the first ride served after the restart.
//
// TestChaosCitusWorkerFailover does the same with a streaming standby of
// that worker, to which its commits are synchronous, and does not start
// the killed worker again: five seconds after the kill the standby is
// promoted (pg_ctl promote), the coordinator pointed at it
// (citus_update_node), and Citus's recovery of two-phase commits run
// (recover_prepared_transactions), as docs/citus.md tells an operator to.
// Besides the invariants above, no ride answered 201 may be missing on the
// promoted standby, as in the failover tests, and no prepared transaction
// may be left on it once the riders are done; the summary gives the times
// from the kill to the promotion and to the first ride served for the
// killed worker's riders.
//
// # Callers
//
// TestCallersUnderFaults puts the clients of package caller to the same
// kind of test: a dozen riders send logical requests, some as concurrent
// copies under one key and a quarter with a budget of two attempts,
// through a proxy in front of each API process that drops connections
// before the request reaches the process and after its answer left it, and
// answers 503 with Retry-After, while API processes are killed and
// restarted and the fake Stripe fails charges. Each request must end with
// its caller holding the key's stored answer or a caller.UnknownOutcomeError
// naming the key; each unknown outcome is then retried with its key and
// must get the final answer; and every ride answered 201 has exactly one
// charge at Stripe, every other answer none. TestCallersUnderFaultsAccepted
// does the same with the API processes answering 202 Accepted once the ride
// exists and charging in the background (rides serve -accept): the callers
// poll each ride's status to its answer.
//
// # Soak
//
// By default the tests send traffic for 45, 30, 20 (the callers' test) and
// (the failover tests) 15 seconds, run in parallel, and the package takes
// one to two minutes.
// ATOMICPHASE_CHAOS_SOAK sets a longer traffic duration for the tests
// without replication and for the Citus tests, and
// ATOMICPHASE_FAILOVER_SOAK for the failover tests on one Postgres, which
// then fail over every 30 seconds:
//
//	ATOMICPHASE_CHAOS_SOAK=10m go test -race -timeout 30m -v ./examples/rides/chaos
//	ATOMICPHASE_FAILOVER_SOAK=5m go test -race -timeout 30m -v -run Failover ./examples/rides/chaos
//
// The API and fake Stripe processes are built once per test binary, without
// the race detector, from ./examples/rides. Every child process is killed
// when its test ends, and by the kernel if the test binary dies first: the
// tests rely on Linux's parent-death signal, so they build only on Linux.
package chaos
