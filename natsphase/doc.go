// Package natsphase runs a workflow once per NATS JetStream message, for
// consumers of messages delivered at least once: the message's id is the
// idempotency key (see package consume), and the message is acknowledged
// only after its workflow finished. The package's example is a complete
// payout consumer on an embedded JetStream server; its consumer, with the
// client and w, the payout workflow:
//
//	consumer, err := natsphase.NewConsumer(client, w, natsphase.Config[Payout]{
//		DeadLetter: "payouts.dead", JetStream: js, Logger: logger})
//	if err != nil {
//		log.Fatal(err)
//	}
//	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
//		Durable:       "payouts",
//		AckPolicy:     jetstream.AckExplicitPolicy,
//		AckWait:       30 * time.Second, // a dead consumer's message is delivered again after it
//		MaxDeliver:    20,               // then the message goes to payouts.dead
//		MaxAckPending: 1,                // one process consumes: no message waits unreported behind another
//	})
//	if err != nil {
//		log.Fatal(err)
//	}
//	cc, err := consumer.Consume(ctx, cons)
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer cc.Stop()
//
// # Settling a message
//
// Ack acknowledges the message and waits for the server to confirm (a lost
// acknowledgement redelivers the message, which replays). Retry naks it
// with a pause that grows with its deliveries ([consume.Verdict.Backoff],
// or the consumer's own BackOff when it has one). Drop, and a Retry at the
// last delivery allowed ([Config.MaxDeliver], or the consumer's
// MaxDeliver if lower), publish the message to [Config.DeadLetter] when
// set and then terminate it with the reason: it is never delivered again,
// and its key stays as its last run left it. Abandon leaves the message to
// be delivered again after the consumer's AckWait. A message whose key is
// in flight in another run is never given up on; one whose dead letter
// cannot be stored at its last delivery is left unacknowledged in its
// stream, and an error names its stream and sequence.
//
// A message is dropped only when delivering it again can never help: its
// payload does not decode, its tenant is refused, or its id was first
// used with another payload. An ID, Tenant or Decode function that cannot
// answer for a while (a lookup whose store is down) returns an error
// wrapping phase.ErrUnavailable, and the message is retried.
//
// # Settings that matter
//
// Consume tells JetStream every half AckWait that a message whose run
// lasts is still in progress, so AckWait need not exceed the client's
// RunTimeout: it is how soon the message of a consumer that died is
// delivered again (JetStream's default is 30 seconds). With a BackOff,
// the shortest of its pauses plays AckWait's part. Messages JetStream sent
// behind the one being run wait their turn unreported, and are delivered
// again once they waited AckWait: set the consumer's MaxAckPending to the
// number of processes that call Consume, or AckWait above the longest a
// message can wait. Handler and Handle do
// not know AckWait: with them, set it above the client's RunTimeout (5
// minutes by default), or a message still being run is delivered again,
// and retried while its key is in flight.
//
// Run the client's background services (phase.Client.Start) in the
// consumer's process, or in another process that registers the same
// workflows: a redelivery resumes a key whose run stopped, but only the
// completer reconciles a key on hold because a call's outcome is unknown,
// and finishes the key of a message given up on.
//
// # Message ids
//
// The key is the Nats-Msg-Id header, the id JetStream deduplicates
// publishes by. Publishers must set it to the id of the business operation
// (a payout's id), the same on every retry of the publish: without it the
// key is the stream's name and the message's sequence, and a publisher
// that publishes twice (a retry after a timeout) makes two messages, two
// keys and two payouts.
//
// # The module
//
// natsphase is a module of its own, so that the core does not depend on
// NATS; require both at the same release. Its go.mod reaches the core
// through a replace, which Go ignores in a dependency: to build against a
// local checkout, put both replaces in your own go.mod and run go mod tidy:
//
//	replace (
//		github.com/atomicphase/atomicphase => ../atomicphase
//		github.com/atomicphase/atomicphase/natsphase => ../atomicphase/natsphase
//	)
package natsphase
