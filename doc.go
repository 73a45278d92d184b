// Package atomicphase makes multi-step API handlers safe to retry: a POST
// that charges a card, books a ride or sends a payout runs at most once per
// Idempotency-Key, however often the client retries and wherever the server
// crashes.
//
// It follows the design Brandur Leach described for Stripe: the request is a
// sequence of atomic phases over Postgres, and a row per idempotency key
// records how far the request got.
//
// # Atomic phases
//
// An atomic phase is one Postgres transaction that does the request's
// database work for that step, commits at most one foreign side effect (a
// Stripe charge, a payout), and advances the key's recovery point, all or
// nothing. If the process dies in the middle of a phase, the transaction
// rolls back and the key still names the last committed phase; the next
// attempt resumes right after it, so no committed phase runs twice.
//
// A foreign call cannot be rolled back, so it is made outside any
// transaction, with a downstream idempotency key derived from the request
// and the phase. If the process dies after the call but before its outcome
// is recorded, the resumed run of a Repeatable phase repeats the call with
// the same downstream key, and the provider answers with the original
// result instead of acting twice; any other phase's call is reconciled, or
// held for an operator, never sent again blindly.
//
// # Changing a workflow
//
// Every key records the definition of its workflow it started under (a hash
// of its phase list), and only a process that runs that definition, or
// adopts it, resumes the key: a deploy never resumes a key with phases it
// did not start with unless its author said how. See
// docs/changing-a-workflow.md.
//
// # Example
//
// A workflow declares its phases in order over a request type and a state
// type; the state is committed with each phase:
//
//	type Ride struct{ OriginLat, OriginLon, TargetLat, TargetLon float64 }
//	type RideState struct {
//		RideID   int64
//		ChargeID string
//	}
//
//	rides, err := phase.NewWorkflow("rides",
//		phase.Local("ride_created", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Ride, RideState]) (phase.Result, error) {
//			err := tx.QueryRow(ctx, `INSERT INTO rides (...) VALUES (...) RETURNING id`, ...).Scan(&in.State.RideID)
//			return phase.Next(), err
//		}),
//		phase.Foreign("charge_created",
//			func(ctx context.Context, in *phase.Input[Ride, RideState]) (string, error) {
//				return charge(ctx, 2000, in.DownstreamKey()) // the provider deduplicates on the key
//			},
//			func(ctx context.Context, tx pgx.Tx, in *phase.Input[Ride, RideState], chargeID string) (phase.Result, error) {
//				in.State.ChargeID = chargeID
//				return phase.Next(), nil
//			}).Repeatable(),
//		phase.Local("receipt_queued", func(ctx context.Context, tx pgx.Tx, in *phase.Input[Ride, RideState]) (phase.Result, error) {
//			// enqueue the receipt in the same transaction...
//			return phase.JSON(http.StatusCreated, map[string]any{"ride_id": in.State.RideID}), nil
//		}),
//	)
//	client, err := phase.NewClient(pool, nil, rides) // one per process
//	handler, err := phase.Handler(client, rides, phase.HTTPConfig[Ride]{Tenant: userFromAuthorization})
//	mux.Handle("POST /rides", handler)
//	err = client.Start(ctx) // the completer and the reaper; client.Stop(ctx) on shutdown
//
// The handler answers a retry of a finished key with the stored response:
// the same status and body, with only the headers that describe the
// resource, never a cookie (with Idempotent-Replayed: true; see
// docs/stored-responses.md); a retry while the first
// request still runs with 409 and Retry-After; a key reused with another
// payload with 422; a crashed request's retry by resuming it.
//
// # Recovery
//
// Each key row holds a lease (locked_at, lock_expires_at) with a fencing
// token. A request takes the lease with one statement; a crashed holder's
// lease expires by the database clock and the next request takes it over,
// while the old holder, if it is only slow, is fenced out of every write and
// of its next foreign call. When no client comes back, the client's
// completer resumes abandoned keys, and its reaper deletes the finished keys
// of its workflows once the retention each key recorded is over.
//
// Every phase commit waits for the WAL flush, as the server's
// synchronous_commit says; taking and renewing a lease do not. A lease lost
// with the last moments of WAL in a server crash is harmless: every phase
// its holder committed was flushed, and the lease with it; the holder is
// fenced out of further writes; and the next run takes the key again and
// sends any foreign call with the same downstream key.
//
// # Packages
//
//   - phase: workflows and phases, the [phase.Client] that runs them and
//     owns the completer and the reaper, the HTTP handler, fault injection.
//     phase/phasetest proves in your own tests that a workflow converges
//     after a crash at every fault point and under every pair of faults
//     (a crash with a duplicate, a takeover mid-call, the completer with a
//     retry), on a throwaway database it provides.
//   - recovery: how keys without a client are completed, reconciled, given
//     up on and reaped, and the configuration of those services.
//   - keyrow: the key's model ([keyrow.Row], its states and holds), header
//     parsing, request fingerprints and downstream keys.
//   - lockttl: the lease's rules: TTL, renewal, Retry-After.
//   - otelphase: OpenTelemetry spans and metrics for runs, phases, foreign
//     calls and completer passes, as a [phase.Hook]. Only programs
//     that import it depend on OpenTelemetry.
//   - cmd/atomicphase: inspect, list, unlock, retry and reap keys; migrate.
//   - examples/quickstart: the README's complete program;
//     examples/rides: the Stripe rides example; examples/transfers: a ledger
//     with external payouts.
//
// # Migrations
//
// Call [Migrate] before use, at every start if you like: it applies the
// numbered migrations the database lacks, each in its own transaction, and
// records their versions in atomicphase_migration, safely from many
// instances at once. schema.sql holds the whole current schema for reading;
// teams with their own migration tool take each version's SQL from
// [Migrations] or 'atomicphase migrate -print'.
//
// The tables go where the connection's search_path finds them, normally
// public. To keep them in a schema of their own, migrate with a [Migrator]
// that names it and give the client the same name (phase.Config.Schema):
// every statement of the library then names that schema.
package atomicphase
