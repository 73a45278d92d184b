// Package natsphase runs a workflow once per NATS JetStream message, for
// consumers of messages delivered at least once: the message's id is the
// idempotency key (see package consume), and the message is acknowledged
// only after its workflow finished.
//
//	c, err := natsphase.NewConsumer(client, w, natsphase.Config[Order]{})
//	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "orders", AckPolicy: jetstream.AckExplicitPolicy})
//	cc, err := cons.Consume(c.Handler(ctx))
//
// What each verdict does to the message: Ack acknowledges it and waits for
// the server to confirm (a lost acknowledgement redelivers the message,
// which replays); Retry naks it with the verdict's delay; Drop terminates
// it, so that it is never delivered again; Abandon leaves it to be
// redelivered after the consumer's AckWait. Set AckWait above the client's
// RunTimeout, or a message still being run is delivered again, and that
// delivery is retried while the key is in flight.
package natsphase

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atomicphase/atomicphase/consume"
	"github.com/atomicphase/atomicphase/phase"
)

// Config configures a Consumer. Zero values mean the documented default.
type Config[Req any] struct {
	// ID returns the message's id, its idempotency key. Defaults to the
	// Nats-Msg-Id header, the id JetStream deduplicates publishes by,
	// and, without one, the stream's name and the message's sequence in
	// it, which every redelivery of one stored message shares.
	ID func(msg jetstream.Msg) (string, error)
	// Tenant returns whose key the message uses. Defaults to the stream's
	// name.
	Tenant func(msg jetstream.Msg) (string, error)
	// Decode reads the message's payload. Defaults to encoding/json.
	Decode func(msg jetstream.Msg) (Req, error)
	// Logger receives a record of every message not acknowledged.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// Consumer runs one workflow for the messages of JetStream consumers.
type Consumer[Req, State any] struct {
	client   *phase.Client
	workflow *phase.Workflow[Req, State]
	cfg      Config[Req]
}

// NewConsumer returns a Consumer that runs w with c.
func NewConsumer[Req, State any](c *phase.Client, w *phase.Workflow[Req, State], cfg Config[Req]) (*Consumer[Req, State], error) {
	if c == nil || w == nil {
		return nil, errors.New("natsphase: NewConsumer needs a client and a workflow")
	}
	if cfg.ID == nil {
		cfg.ID = MessageID
	}
	if cfg.Tenant == nil {
		cfg.Tenant = func(msg jetstream.Msg) (string, error) {
			md, err := msg.Metadata()
			if err != nil {
				return "", err
			}
			return md.Stream, nil
		}
	}
	if cfg.Decode == nil {
		cfg.Decode = func(msg jetstream.Msg) (Req, error) {
			var req Req
			err := json.Unmarshal(msg.Data(), &req)
			return req, err
		}
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return &Consumer[Req, State]{client: c, workflow: w, cfg: cfg}, nil
}

// MessageID is the default Config.ID: the Nats-Msg-Id header, else
// "<stream>:<sequence>".
func MessageID(msg jetstream.Msg) (string, error) {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id, nil
	}
	md, err := msg.Metadata()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s:%d", md.Stream, md.Sequence.Stream), nil
}

// Handler returns a handler for jetstream.Consumer.Consume that handles
// every message under ctx.
func (c *Consumer[Req, State]) Handler(ctx context.Context) jetstream.MessageHandler {
	return func(msg jetstream.Msg) { c.Handle(ctx, msg) }
}

// Handle runs msg's workflow, settles msg as the verdict says, and
// returns the verdict. A message whose id, tenant or payload cannot be
// read is terminated.
func (c *Consumer[Req, State]) Handle(ctx context.Context, msg jetstream.Msg) consume.Verdict {
	v := c.run(ctx, msg)
	var err error
	switch v.Action {
	case consume.Ack:
		err = msg.DoubleAck(ctx)
	case consume.Retry:
		err = msg.NakWithDelay(v.Delay)
	case consume.Drop:
		err = msg.Term()
	}
	if v.Action != consume.Ack || err != nil {
		c.cfg.Logger.Warn("message not acknowledged", "workflow", c.workflow.Name(), "subject", msg.Subject(),
			"action", v.Action.String(), "delay", v.Delay, "err", errors.Join(v.Err, err))
	}
	return v
}

func (c *Consumer[Req, State]) run(ctx context.Context, msg jetstream.Msg) consume.Verdict {
	id, err := c.cfg.ID(msg)
	if err != nil {
		return consume.Verdict{Action: consume.Drop, Err: fmt.Errorf("natsphase: message id: %w", err)}
	}
	tenant, err := c.cfg.Tenant(msg)
	if err != nil {
		return consume.Verdict{Action: consume.Drop, Err: fmt.Errorf("natsphase: tenant: %w", err)}
	}
	req, err := c.cfg.Decode(msg)
	if err != nil {
		return consume.Verdict{Action: consume.Drop, Err: fmt.Errorf("natsphase: decode: %w", err)}
	}
	return consume.Run(ctx, c.client, c.workflow, tenant, id, req)
}
