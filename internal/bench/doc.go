// Package bench measures what the library costs: time, throughput,
// statements and round trips per request, against the same work written
// by hand with raw pgx after the reference implementation, and how acquire
// and the reaper behave on a large keys table.
//
// # What is compared
//
// Both implementations serve one request, an order, with three local
// phases and no foreign call, so that the comparison is database overhead
// alone: insert the order; confirm it; write an audit record and answer 201.
// The phases run the same statements in both, one each.
//
// The rides-shaped request is shaped like the rides example: insert the
// order; charge it with a POST to a local HTTP stub that honours idempotency
// keys, and record the charge; write the audit record and answer 201. The
// library makes the call outside any transaction with its downstream key;
// the baseline makes it inside the phase's transaction, as the reference
// does.
//
// The library runs them as a phase.Workflow: acquire (one statement), then
// BEGIN pipelined with the first phase's statement; the fenced advance of a
// phase followed by a local phase waits and travels with the next phase's
// statement, behind one COMMIT AND CHAIN that ends the one transaction and
// begins the other; the last phase's fenced finish is pipelined with
// COMMIT. Before the foreign call of the rides-shaped request the advance
// is pipelined with COMMIT, and the call's record begins a transaction of
// its own.
//
// The baseline follows rocket-rides-atomic: its own keys table
// (baseline_keys, shaped like the reference's), one upsert that inserts or
// locks the key, then per phase BEGIN, the phase's statement, an UPDATE of
// the recovery point (the last phase stores the response in it) and COMMIT,
// each its own round trip. A replay or a conflict costs it a second
// statement, a lookup, because its upsert returns no row for them. It has no
// fencing token and keeps no phase state.
//
// Replay sends a finished key again; 409 sends a key whose lease another run
// holds for an hour. Each client replays, or conflicts on, a key of its own.
//
// Both run on one pool of MaxConns connections, whose tracer counts
// statements and round trips (pgtest.StatementCounter).
//
// # Cost model
//
// TestEachPathCostsWhatTheCostModelSays pins the counts: the three-phase
// request costs the library 1 + 3 + 1 = 5 round trips (11 statements:
// acquire, BEGIN, three phase statements, two advances, two COMMIT AND
// CHAIN, the finish and COMMIT) and the baseline 13 (13 statements); the
// rides-shaped one costs the library 7 round trips and 13 statements
// (its foreign call needs no lease renewal of its own right after the
// commit before it; its record commits on its own, before the next phase
// runs) and the baseline 13; replay and 409 cost the library
// one statement and the baseline two. (A key the library resumes after a
// crash costs it one statement more, the takeover; the benchmarks send
// none.)
//
// # Running
//
// The request comparison (three-phase, rides-shaped, replay, 409), at 1, 8
// and 32 concurrent clients:
//
//	go test -run '^$' -bench Requests -benchtime 3s ./internal/bench/
//
// ns/op is wall time over requests (the inverse of throughput); mean-us,
// p50-us and p99-us are the time one request took. go test measures each
// benchmark separately; for ratios taken in one run, with library and
// baseline alternating round by round, use the command:
//
//	go run ./internal/bench/cmd/benchtable
//
// The benchmarks that load millions of keys run only when
// ATOMICPHASE_BENCH_LARGE is set: acquire with 10 million finished keys in
// the table (beside the 10 thousand it always measures), and the reaper
// deleting a million expired keys with its default batch size and pause
// while the workflow runs from 8 clients (it runs once; give it -benchtime
// 1x):
//
//	ATOMICPHASE_BENCH_LARGE=1 go test -run '^$' -bench Acquire -benchtime 3s -timeout 60m ./internal/bench/
//	ATOMICPHASE_BENCH_LARGE=1 go test -run '^$' -bench Reaper -benchtime 1x -timeout 30m ./internal/bench/
//
// benchtable -large prints the same in tables.
//
// # Draining a backlog
//
// Env.DrainUnderTraffic abandons a backlog of rides-shaped keys before
// their first phase, the stub's charge taking a set time, runs live
// three-phase requests paced as live traffic arrives, and times how long
// one or more completers (each a client over a pool of its own, as
// separate processes) with the default configuration take to finish every
// key, checking that each key was charged and created its order once. It
// reports keys a second, the time to empty, the live p50 and p99 before and
// during, the server's CPU time and the completers' statements per drained
// key, and how busy the whole machine was. benchtable -drain 10000,100000
// prints it for 1 and 2 nodes; TestDrainFinishesABacklogOnTwoNodesEachKeyOnce
// runs it on a small backlog.
//
// # Citus
//
// On a Citus coordinator, Open distributes the library's key table
// (atomicphase.Distribute) and the workload's and the baseline's tables by
// tenant, co-located. The keys of both sides are spread over 64 tenants by
// a hash of the key, so every worker holds some of them. Every statement of
// either side names the tenant, so each runs on one shard; with citus.enable_stat_counters on, Results count
// the statements Citus ran on one shard and on several. benchtable -configs
// citus starts such a cluster.
package bench
