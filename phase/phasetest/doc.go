// Package phasetest proves, in a workflow author's own tests, that a
// workflow converges whatever point a run crashes at, and whatever second
// thing happens to its key meanwhile.
//
// A whole test, Postgres included:
//
//	func TestMain(m *testing.M) { phasetest.Main(m) }
//
//	func TestOrdersConverge(t *testing.T) {
//		pool := phasetest.Pool(t) // a new, migrated database; see phasetest.EnvDSN
//		if _, err := pool.Exec(t.Context(), ordersSchema); err != nil {
//			t.Fatal(err)
//		}
//		orders := newOrders(pool)
//		client, err := phase.NewClient(pool, &phase.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
//			Completer: recovery.CompleterConfig{StuckAfter: -1, Backoff: -1}}, orders) // take free keys at once
//		if err != nil {
//			t.Fatal(err)
//		}
//		cfg := phasetest.Config[Order, OrderState]{
//			Client: client, DB: pool, Workflow: orders, WithCompleter: true,
//			Request: func(string) Order { return Order{Item: "lamp", Amount: 2000} },
//			Compare: phasetest.IgnoreFields("order_id"), // a new order id for every key
//			Check: func(t testing.TB, s phasetest.Scenario) { // one order, one charge
//				var orders, charges int
//				err := pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM orders WHERE key_id = $1), (SELECT count(*) FROM charges WHERE key_id = $1)`, s.ID).Scan(&orders, &charges)
//				if err != nil || orders != 1 || charges != 1 {
//					t.Fatalf("%d orders and %d charges (%v), want one of each", orders, charges, err)
//				}
//			},
//		}
//		phasetest.CrashMatrix(t, cfg)
//		phasetest.PairMatrix(t, cfg)
//	}
//
// The package's example_test.go holds this test with the workflow it
// tests: an order row, a charge, a response.
//
// # Crashes
//
// [CrashMatrix] runs the workflow once to discover its fault points, then
// for each point crashes a fresh key there exactly as a killed process would
// (transaction rolled back, lease not freed), recovers it the way production
// does (a client retry, and the completer with Config.WithCompleter), and
// checks that the final response matches the crash-free one, that every
// retry replays it byte for byte, and that the author's invariants hold
// (Config.Check: one charge per key).
//
// # Promises, not only outcomes
//
// A provider that honours idempotency keys hides a call sent twice, and a
// check of the outcome alone (one charge) hides a phase run twice. So every
// matrix also watches each run of each scenario at its fault points, for any
// workflow and with no code of the author's, and fails the scenario, naming
// the phase and the counts, when the runner breaks a promise on the way:
//
//   - a foreign call is sent again only if no record of it committed: when
//     a run is about to send a phase's call, the key's recovery point is
//     still before that phase;
//   - a recorded call is never lost: once a call returned, nothing of a
//     later phase begins before its record committed;
//   - a committed phase never runs again, and a phase's after_commit point
//     is reached only once the phase is committed;
//   - a run whose lease was taken over commits nothing;
//   - once every run on the key has ended, no lease is left, and a finished
//     key holds no pending call mark; replays are byte for byte the stored
//     answer.
//
// A key may instead end on hold for an operator, for the one documented
// reason a scenario can cause: a run stopped after marking a call that is
// not safe to repeat as about to be sent (its in_call point or later), and
// the phase has no reconcile function. The scenario then checks that the
// hold names that phase, that the call went out at most once, that no
// lease is left and that a retry leaves the key on hold, and calls
// Config.Check with Scenario.Hold set and no Response.
//
// The checks read the key through Config.Client while a run may be paused,
// so the client's pool needs a connection more than its runs hold.
//
// # Pairs of faults
//
// Real incidents combine two things: a crash while a duplicate request
// arrives, a lease that runs out while its holder is still running (in the
// middle of a foreign call, say), the completer taking a key while the
// client's retry is on its way. [PairMatrix] pauses a first run at every
// fault point and, while it is paused, sends a duplicate and runs a
// completer pass, or lets its lease run out and has a retry or the completer
// take the key over, itself paused at a second point while the first run
// wakes up. Every interleaving is driven through channels at fault points,
// never by sleeping, so each scenario is the same on every run.
//
// No scenario sleeps out a lease: the lease of a crashed or stalled run is
// freed with Client.Unlock, which is what its expiry would do.
//
// # Comparing responses
//
// Responses that carry values made per key (an order id) differ between
// keys. [IgnoreFields] compares JSON bodies as values, ignoring the named
// fields' values but not their presence, and a failure names the field
// that differs: `body field items[1].price: crash-free 20, recovered 25`.
//
// # A database for the tests
//
// [Pool] and [DSN] give each test a new database, migrated with
// atomicphase.Migrate, on a server from the environment variable [EnvDSN],
// a Docker container, or the PostgreSQL binaries on the machine, and drop it
// when the test ends. The matrices use fresh keys on every call, so they
// also run twice on one database (two tests, -count=2), and on a database of
// the author's own.
package phasetest
