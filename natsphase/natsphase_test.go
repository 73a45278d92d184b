package natsphase_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
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
// While down is set for an order, it refuses to ship it; an order in
// slow takes that long to ship.
type carrier struct {
	mu    sync.Mutex
	calls map[string]int
	down  map[string]bool
	slow  map[string]time.Duration
	// before, when set, is called before each call, and fails it with
	// its error.
	before func(order string) error
}

func (c *carrier) ship(key, order string) (string, error) {
	c.mu.Lock()
	c.calls[key]++
	down, slow, before := c.down[order], c.slow[order], c.before
	c.mu.Unlock()
	if before != nil {
		if err := before(order); err != nil {
			return "", err
		}
	}
	time.Sleep(slow)
	if down {
		return "", errors.New("carrier: cannot ship " + order)
	}
	return "label-" + key, nil
}

func (c *carrier) setDown(order string, down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down[order] = down
}

func (c *carrier) count() (keys, calls int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.calls {
		keys, calls = keys+1, calls+n
	}
	return keys, calls
}

// env is an embedded NATS server with JetStream, a stream of shipments, a
// stream of their dead letters, and a consumer that runs the shipping
// workflow for each shipment.
type env struct {
	pool     *pgxpool.Pool
	js       jetstream.JetStream
	cons     jetstream.Consumer
	dead     jetstream.Stream
	carrier  *carrier
	client   *phase.Client
	workflow *phase.Workflow[shipment, shipState]
	consumer *natsphase.Consumer[shipment, shipState]
	logs     *logs
	verdicts chan consume.Verdict

	mu         sync.Mutex
	deliveries map[string][]time.Time // by Nats-Msg-Id, as ID saw them
}

// logs keeps what the client and the consumer log, from warnings up.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines returns the logged lines that contain every one of parts.
func (l *logs) lines(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found []string
	for line := range strings.Lines(l.buf.String()) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			found = append(found, line)
		}
	}
	return found
}

// options are what a test changes in setup.
type options struct {
	// duplicates is the shipments stream's duplicate window.
	duplicates time.Duration
	// verdicts: the consumer runs through Handle, and sends each
	// delivery's verdict to env.verdicts; otherwise through Consume.
	verdicts bool
	// crashFirst, when set, crashes the first delivery of each message
	// there, as a killed consumer stops. It needs verdicts.
	crashFirst *phase.Point
	// consumer holds the JetStream consumer's MaxDeliver and BackOff.
	consumer jetstream.ConsumerConfig
	// deadStreamLater: setup creates no stream for the dead letters;
	// the test does, with env.createDeadStream.
	deadStreamLater bool
	// lookup, when set, is called with the message by ID, Tenant or Decode,
	// as read names it ("id", "tenant", "decode").
	lookup func(ctx context.Context, pool *pgxpool.Pool, read string, msg jetstream.Msg) error
}

func setup(t *testing.T, o options) *env {
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
	e := &env{carrier: &carrier{calls: map[string]int{}, down: map[string]bool{}, slow: map[string]time.Duration{}}, verdicts: make(chan consume.Verdict, 100),
		deliveries: map[string][]time.Time{}, logs: &logs{}}
	if e.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	stream, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "SHIPMENTS", Subjects: []string{"shipments"}, Duplicates: o.duplicates})
	if err != nil {
		t.Fatal(err)
	}
	if !o.deadStreamLater {
		e.createDeadStream(t)
	}
	cc := o.consumer
	cc.Durable, cc.AckPolicy = "shipper", jetstream.AckExplicitPolicy
	if len(cc.BackOff) == 0 && cc.AckWait == 0 {
		cc.AckWait = time.Second
	}
	if e.cons, err = stream.CreateOrUpdateConsumer(ctx, cc); err != nil {
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
			func(ctx context.Context, r *in) (string, error) {
				return e.carrier.ship(r.DownstreamKey(), r.Req.Order)
			},
			func(ctx context.Context, tx pgx.Tx, r *in, label string) (phase.Result, error) {
				r.State.Label = label
				_, err := tx.Exec(ctx, `UPDATE shipments SET label = $2 WHERE key_id = $1`, r.ID, label)
				return phase.JSON(200, r.State), err
			}).Repeatable())
	if err != nil {
		t.Fatal(err)
	}
	e.workflow = w
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), e.logs), &slog.HandlerOptions{Level: slog.LevelWarn}))
	if e.client, err = phase.NewClient(e.pool, &phase.Config{LeaseTTL: time.Second, Logger: logger}, w); err != nil {
		t.Fatal(err)
	}
	read := func(name string, msg jetstream.Msg) error {
		if o.lookup == nil {
			return nil
		}
		return o.lookup(ctx, e.pool, name, msg)
	}
	cfg := natsphase.Config[shipment]{Logger: logger, DeadLetter: "shipments.dead", JetStream: e.js,
		ID: func(msg jetstream.Msg) (string, error) {
			e.mu.Lock()
			id := msg.Headers().Get(jetstream.MsgIDHeader)
			e.deliveries[id] = append(e.deliveries[id], time.Now())
			e.mu.Unlock()
			if err := read("id", msg); err != nil {
				return "", err
			}
			return natsphase.MessageID(msg)
		},
		Tenant: func(msg jetstream.Msg) (string, error) { return "shipping", read("tenant", msg) },
		Decode: func(msg jetstream.Msg) (shipment, error) {
			var s shipment
			if err := read("decode", msg); err != nil {
				return s, err
			}
			return s, json.Unmarshal(msg.Data(), &s)
		}}
	if e.consumer, err = natsphase.NewConsumer(e.client, w, cfg); err != nil {
		t.Fatal(err)
	}
	var consuming jetstream.ConsumeContext
	if !o.verdicts {
		consuming, err = e.consumer.Consume(ctx, e.cons)
	} else {
		consuming, err = e.cons.Consume(func(msg jetstream.Msg) {
			ctx := ctx
			if md, err := msg.Metadata(); err == nil && md.NumDelivered == 1 && o.crashFirst != nil {
				// The first delivery stops there, as a killed consumer would.
				ctx = phase.WithInjector(ctx, phase.CrashAt(*o.crashFirst))
			}
			e.verdicts <- e.consumer.Handle(ctx, msg)
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consuming.Stop)
	return e
}

// createDeadStream creates the stream of the dead letters.
func (e *env) createDeadStream(t *testing.T) {
	t.Helper()
	dead, err := e.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "SHIPMENTS_DEAD", Subjects: []string{"shipments.dead"}})
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.dead = dead
	e.mu.Unlock()
}

// delivered returns when ID saw each delivery of the message id.
func (e *env) delivered(id string) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.deliveries[id])
}

// deadLetters returns the messages of the dead-letter stream.
func (e *env) deadLetters(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	e.mu.Lock()
	dead := e.dead
	e.mu.Unlock()
	if dead == nil {
		return nil
	}
	info, err := dead.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var letters []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := dead.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		letters = append(letters, m)
	}
	return letters
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
	e := setup(t, options{verdicts: true, crashFirst: &phase.Point{Phase: "recorded", Stage: phase.AfterCommit}})
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
	e := setup(t, options{duplicates: 100 * time.Millisecond, verdicts: true})
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
