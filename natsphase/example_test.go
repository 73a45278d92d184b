package natsphase_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/natsphase"
	"github.com/atomicphase/atomicphase/phase"
)

// A payout consumer on an embedded JetStream server. The publisher names
// each payout with Nats-Msg-Id, so a publish it repeats is stored once and
// pays once; a payload that does not decode is kept in the dead-letter
// stream for an operator.
func Example() {
	ctx := context.Background()
	pool, done, err := pgtest.NewPool(ctx, "natsphase_example") // your application's pool, migrated
	if err != nil {
		log.Fatal(err)
	}
	defer done()

	// An embedded JetStream server, for tests and demos; an application
	// connects to its own with nats.Connect(url).
	dir, err := os.MkdirTemp("", "jetstream")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true})
	if err != nil {
		log.Fatal(err)
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		log.Fatal("nats server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	type Payout struct {
		Supplier string `json:"supplier"`
		Cents    int64  `json:"cents"`
	}
	var transfers atomic.Int64 // the bank, which honours the downstream key
	w, err := phase.NewWorkflow("payouts",
		phase.Foreign("transferred",
			func(ctx context.Context, in *phase.Input[Payout, struct{}]) (string, error) {
				transfers.Add(1)
				return "tr_" + in.DownstreamKey(), nil
			},
			func(ctx context.Context, tx pgx.Tx, in *phase.Input[Payout, struct{}], transfer string) (phase.Result, error) {
				return phase.JSON(200, transfer), nil
			}).Repeatable())
	if err != nil {
		log.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler) // your logger
	client, err := phase.NewClient(pool, &phase.Config{Logger: logger}, w)
	if err != nil {
		log.Fatal(err)
	}
	// The completer reconciles keys on hold and finishes those whose
	// message was given up on.
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx)

	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PAYOUTS", Subjects: []string{"payouts"}})
	if err != nil {
		log.Fatal(err)
	}
	dead, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PAYOUTS_DEAD", Subjects: []string{"payouts.dead"}})
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := natsphase.NewConsumer(client, w, natsphase.Config[Payout]{
		DeadLetter: "payouts.dead", JetStream: js, Logger: logger})
	if err != nil {
		log.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       "payouts",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second, // a dead consumer's message is delivered again after it
		MaxDeliver:    20,               // then the message goes to payouts.dead
		MaxAckPending: 1,                // one process consumes: no message waits unreported behind another
	})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := consumer.Consume(ctx, cons)
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()

	// The publisher sets Nats-Msg-Id to the payout's id, on every retry
	// of the publish.
	for range 2 {
		if _, err := js.Publish(ctx, "payouts", []byte(`{"supplier":"acme","cents":5000}`), jetstream.WithMsgID("payout-1")); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, "payouts", []byte(`{"supplier":`), jetstream.WithMsgID("payout-2")); err != nil {
		log.Fatal(err)
	}

	for {
		info, err := cons.Info(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	letter, err := dead.GetLastMsgForSubject(ctx, "payouts.dead")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("transfers:", transfers.Load())
	fmt.Println("dead letter:", letter.Header.Get(natsphase.KeyHeader), "-", letter.Header.Get(natsphase.ReasonHeader))
	// Output:
	// transfers: 1
	// dead letter: payout-2 - natsphase: decode: unexpected end of JSON input
}
