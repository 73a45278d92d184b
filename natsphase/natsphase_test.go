package natsphase_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atomicphase/atomicphase/consume"
	"github.com/atomicphase/atomicphase/natsphase"
	"github.com/atomicphase/atomicphase/phase"
	"github.com/atomicphase/atomicphase/phase/phasetest"
)

func TestMain(m *testing.M) { phasetest.Main(m) }

type shipment struct {
	Order string `json:"order"`
}

type shipState struct {
	Label string `json:"label"`
}

// carrier is a fake carrier that honours idempotency keys, as the
// Repeatable phase requires, and counts the calls by key.
type carrier struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *carrier) ship(key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[key]++
	return "label-" + key
}

func (c *carrier) count() (keys, calls int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.calls {
		keys, calls = keys+1, calls+n
	}
	return keys, calls
}

// env is an embedded NATS server with JetStream, a stream of shipments,
// and a consumer that runs the shipping workflow for each.
type env struct {
	pool     *pgxpool.Pool
	js       jetstream.JetStream
	cons     jetstream.Consumer
	carrier  *carrier
	consumer *natsphase.Consumer[shipment, shipState]
	verdicts chan consume.Verdict
}

func setup(t *testing.T, duplicates time.Duration, crashFirst *phase.Point) *env {
	t.Helper()
	ctx := t.Context()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e := &env{carrier: &carrier{calls: map[string]int{}}, verdicts: make(chan consume.Verdict, 100)}
	if e.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	stream, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "SHIPMENTS", Subjects: []string{"shipments"}, Duplicates: duplicates})
	if err != nil {
		t.Fatal(err)
	}
	if e.cons, err = stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "shipper", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second}); err != nil {
		t.Fatal(err)
	}

	e.pool = phasetest.Pool(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE shipments (key_id uuid PRIMARY KEY, order_id text NOT NULL, label text)`); err != nil {
		t.Fatal(err)
	}
	type in = phase.Input[shipment, shipState]
	w, err := phase.NewWorkflow("ship",
		phase.Local("recorded", func(ctx context.Context, tx pgx.Tx, r *in) (phase.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO shipments (key_id, order_id) VALUES ($1, $2)`, r.ID, r.Req.Order)
			return phase.Next(), err
		}),
		phase.Foreign("shipped",
			func(ctx context.Context, r *in) (string, error) { return e.carrier.ship(r.DownstreamKey()), nil },
			func(ctx context.Context, tx pgx.Tx, r *in, label string) (phase.Result, error) {
				r.State.Label = label
				_, err := tx.Exec(ctx, `UPDATE shipments SET label = $2 WHERE key_id = $1`, r.ID, label)
				return phase.JSON(200, r.State), err
			}).Repeatable())
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	client, err := phase.NewClient(e.pool, &phase.Config{LeaseTTL: time.Second, Logger: logger}, w)
	if err != nil {
		t.Fatal(err)
	}
	if e.consumer, err = natsphase.NewConsumer(client, w, natsphase.Config[shipment]{Logger: logger}); err != nil {
		t.Fatal(err)
	}
	cc, err := e.cons.Consume(func(msg jetstream.Msg) {
		ctx := ctx
		if md, err := msg.Metadata(); err == nil && md.NumDelivered == 1 && crashFirst != nil {
			// The first delivery stops there, as a killed consumer would.
			ctx = phase.WithInjector(ctx, phase.CrashAt(*crashFirst))
		}
		e.verdicts <- e.consumer.Handle(ctx, msg)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return e
}

func (e *env) publish(t *testing.T, id, order string) {
	t.Helper()
	data, _ := json.Marshal(shipment{Order: order})
	if _, err := e.js.Publish(t.Context(), "shipments", data, jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}
}

// settled waits until the consumer has acknowledged every message.
func (e *env) settled(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		info, err := e.cons.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("messages still pending or unacknowledged")
}

func (e *env) shipped(t *testing.T, want int) {
	t.Helper()
	var rows, labelled int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*), count(label) FROM shipments`).Scan(&rows, &labelled); err != nil || rows != want || labelled != want {
		t.Errorf("shipments: %d rows, %d labelled (%v); want %d", rows, labelled, err, want)
	}
}

// TestARedeliveryAfterACrashResumesTheWorkflow crashes the first delivery
// of a message after its first phase committed, as a consumer killed
// there stops: no ack, the key's lease kept. JetStream delivers it again
// after AckWait; that delivery finds the key in flight and naks it with
// the lease's delay; the next resumes at the second phase and acks.
func TestARedeliveryAfterACrashResumesTheWorkflow(t *testing.T) {
	t.Parallel()
	e := setup(t, 0, &phase.Point{Phase: "recorded", Stage: phase.AfterCommit})
	e.publish(t, "order-1", "o1")
	var actions []string
	for len(actions) == 0 || actions[len(actions)-1] != "ack" {
		select {
		case v := <-e.verdicts:
			actions = append(actions, v.Action.String())
		case <-time.After(20 * time.Second):
			t.Fatalf("verdicts %v, and no ack", actions)
		}
	}
	e.settled(t)
	if len(actions) < 2 || actions[0] != "abandon" {
		t.Errorf("verdicts %v, want abandon first and ack last", actions)
	}
	if keys, calls := e.carrier.count(); keys != 1 || calls != 1 {
		t.Errorf("the carrier got %d calls under %d keys, want one", calls, keys)
	}
	e.shipped(t, 1)
}

// TestADuplicateMessageIsAcknowledgedWithoutEffect publishes one message
// twice under one Nats-Msg-Id, after the stream's duplicate window, so
// that JetStream stores and delivers both: the second replays the stored
// answer and is acknowledged, and nothing runs again.
func TestADuplicateMessageIsAcknowledgedWithoutEffect(t *testing.T) {
	t.Parallel()
	e := setup(t, 100*time.Millisecond, nil)
	e.publish(t, "order-2", "o2")
	first := <-e.verdicts
	time.Sleep(200 * time.Millisecond)
	e.publish(t, "order-2", "o2")
	second := <-e.verdicts
	e.settled(t)
	if first.Action != consume.Ack || first.Outcome.Kind != phase.OutcomeNew {
		t.Errorf("first delivery: %v %+v, want a new run acknowledged", first.Action, first.Outcome)
	}
	if second.Action != consume.Ack || second.Outcome.Kind != phase.OutcomeReplayed || string(second.Outcome.Response.Body) != string(first.Outcome.Response.Body) {
		t.Errorf("duplicate: %v %+v, want the replay acknowledged", second.Action, second.Outcome)
	}
	if keys, calls := e.carrier.count(); keys != 1 || calls != 1 {
		t.Errorf("the carrier got %d calls under %d keys, want one", calls, keys)
	}
	e.shipped(t, 1)
}
