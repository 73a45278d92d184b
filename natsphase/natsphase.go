package natsphase

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atomicphase/atomicphase/consume"
	"github.com/atomicphase/atomicphase/phase"
)

// DefaultMaxDeliver is the delivery at which a message still to be
// retried is given up on, unless Config.MaxDeliver or the JetStream
// consumer's MaxDeliver says otherwise. With [consume.Verdict.Backoff]'s
// pauses, 20 deliveries span about an hour.
const DefaultMaxDeliver = 20

// The headers a dead letter carries besides the message's own. Its
// Nats-Msg-Id header is set to the message's id, so that publishing the
// dead letter back to its subject runs it under the same key.
const (
	// TenantHeader is the tenant of the message's key, when it was read.
	TenantHeader = "Atomicphase-Tenant"
	// ReasonHeader says why the message was given up on.
	ReasonHeader = "Atomicphase-Reason"
	// SubjectHeader is the subject the message was published to.
	SubjectHeader = "Atomicphase-Subject"
	// SequenceHeader is the message's stream and sequence, "<stream>:<sequence>".
	SequenceHeader = "Atomicphase-Sequence"
	// DeliveriesHeader is how many times the message was delivered.
	DeliveriesHeader = "Atomicphase-Deliveries"
)

// ErrDeliveriesExhausted is the Verdict.Err, wrapping the last delivery's
// error, of a message given up on because it would have been retried at
// its last allowed delivery.
var ErrDeliveriesExhausted = errors.New("natsphase: the message ran out of deliveries")

// Config configures a Consumer. Zero values mean the documented default.
type Config[Req any] struct {
	// ID returns the message's id, its idempotency key. Defaults to
	// MessageID: the Nats-Msg-Id header, the id JetStream deduplicates
	// publishes by, and, without one, the stream's name and the message's
	// sequence in it, which every redelivery of one stored message shares
	// but a second publish of the same operation does not.
	ID func(msg jetstream.Msg) (string, error)
	// Tenant returns whose key the message uses. Defaults to the stream's
	// name.
	Tenant func(msg jetstream.Msg) (string, error)
	// Decode reads the message's payload. Defaults to encoding/json.
	//
	// An error of ID, Tenant or Decode drops the message (a malformed
	// payload, a refused tenant), unless it wraps phase.ErrUnavailable,
	// as a lookup whose store is down says it: that message is retried
	// (see consume.ReadFailed).
	Decode func(msg jetstream.Msg) (Req, error)
	// Logger receives a record of every message not acknowledged: a
	// warning for a retry, an error for a message given up on. Defaults
	// to slog.Default().
	Logger *slog.Logger
	// MaxDeliver is the delivery at which a message whose run would be
	// retried is given up on instead: published to DeadLetter when set,
	// then terminated with the reason, its key left as the run left it
	// for a later delivery, the completer or an operator. Consume lowers
	// it to the JetStream consumer's own MaxDeliver, after which
	// JetStream would stop delivering the message without a word.
	// Defaults to DefaultMaxDeliver; -1 retries for as long as JetStream
	// delivers.
	MaxDeliver int
	// DeadLetter is the subject, captured by a stream of its own, to
	// which every message dropped or given up on is published through
	// JetStream, with its payload, its headers and the headers above
	// (TenantHeader, ReasonHeader, ...), before it is terminated. A
	// message whose dead letter could not be published is retried, not
	// terminated. Defaults to none: the message is terminated with the
	// reason, which JetStream announces on
	// $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>, and
	// stays in its stream until the stream's limits remove it.
	DeadLetter string
	// JetStream publishes the dead letters. Required with DeadLetter.
	JetStream jetstream.JetStream
}

// Consumer runs one workflow for the messages of JetStream consumers.
type Consumer[Req, State any] struct {
	client   *phase.Client
	workflow *phase.Workflow[Req, State]
	cfg      Config[Req]
}

// NewConsumer returns a Consumer that runs w with c.
func NewConsumer[Req, State any](c *phase.Client, w *phase.Workflow[Req, State], cfg Config[Req]) (*Consumer[Req, State], error) {
	switch {
	case c == nil || w == nil:
		return nil, errors.New("natsphase: NewConsumer needs a client and a workflow")
	case cfg.MaxDeliver < -1:
		return nil, fmt.Errorf("natsphase: Config.MaxDeliver is %d; use a positive count, or -1 for no limit", cfg.MaxDeliver)
	case cfg.DeadLetter != "" && cfg.JetStream == nil:
		return nil, errors.New("natsphase: Config.DeadLetter needs Config.JetStream to publish with")
	}
	cfg.MaxDeliver = cmp.Or(cfg.MaxDeliver, DefaultMaxDeliver)
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
// "<stream>:<sequence>". Publishers set Nats-Msg-Id to the operation's own
// id, the same on every retry of the publish: a message published twice
// without it is stored twice, under two keys, and runs twice.
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

// Consume consumes the messages of cons with the consumer's handler
// under ctx, and returns what stops it. The handler follows cons's own
// settings: while a message's run lasts it tells JetStream every half
// AckWait that the message is in progress, so that AckWait need not
// exceed the client's RunTimeout; it gives a message up at cons's
// MaxDeliver when that is below Config.MaxDeliver; and when cons has a
// BackOff it naks a retried
// message with the pause BackOff sets for its delivery (or the pause the
// run asked for, if longer: the time left on the lease of a key in
// flight, a provider's Retry-After) instead of consume.Verdict.Backoff's.
func (c *Consumer[Req, State]) Consume(ctx context.Context, cons jetstream.Consumer, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	lim := limits{maxDeliver: c.cfg.MaxDeliver}
	if info := cons.CachedInfo(); info != nil {
		if md := info.Config.MaxDeliver; md > 0 && (lim.maxDeliver == -1 || md < lim.maxDeliver) {
			lim.maxDeliver = md
		}
		lim.backoff = info.Config.BackOff
		lim.ackWait = info.Config.AckWait
		if len(lim.backoff) > 0 {
			// A BackOff replaces AckWait: delivery n waits BackOff[n-1].
			lim.ackWait = slices.Min(lim.backoff)
		}
	}
	return cons.Consume(func(msg jetstream.Msg) { c.handle(ctx, msg, lim) }, opts...)
}

// Handler returns a handler for jetstream.Consumer.Consume that handles
// every message under ctx, with Handle. Prefer Consume, which follows the
// consumer's own AckWait, MaxDeliver and BackOff.
func (c *Consumer[Req, State]) Handler(ctx context.Context) jetstream.MessageHandler {
	return func(msg jetstream.Msg) { c.Handle(ctx, msg) }
}

// Handle runs msg's workflow, settles msg as the verdict says, and returns
// the verdict: Ack acknowledges msg and waits for the server to confirm;
// Retry naks it with consume.Verdict.Backoff of its delivery count; Drop
// publishes it to Config.DeadLetter, when set, and terminates it with the
// reason; Abandon leaves it to be delivered again after the consumer's
// AckWait. A Retry at Config.MaxDeliver is given up on as a Drop is, and
// returned as a Drop whose Err wraps ErrDeliveriesExhausted. Handle does
// not know the consumer's AckWait: set it above the client's RunTimeout,
// or a message still being run is delivered again (and retried while its
// key is in flight).
func (c *Consumer[Req, State]) Handle(ctx context.Context, msg jetstream.Msg) consume.Verdict {
	return c.handle(ctx, msg, limits{maxDeliver: c.cfg.MaxDeliver})
}

// limits are the JetStream consumer's settings a delivery is settled by.
type limits struct {
	maxDeliver int             // -1: no limit
	backoff    []time.Duration // the consumer's BackOff, if any
	ackWait    time.Duration   // the shortest wait for an ack; 0: unknown
}

// delay is the pause before the next delivery of a message whose
// delivery n got v: the consumer's BackOff for delivery n when it has
// one, or the pause the run asked for (the time left on the lease of a
// key in flight, a provider's Retry-After) if longer.
func (l limits) delay(v consume.Verdict, n int) time.Duration {
	if len(l.backoff) == 0 {
		return v.Backoff(n)
	}
	d := l.backoff[min(max(n-1, 0), len(l.backoff)-1)]
	if v.Outcome != nil || v.Delay > consume.DefaultRetryDelay {
		// The run asked: DefaultRetryDelay alone is no request, and
		// BackOff replaces it.
		d = max(d, v.Delay)
	}
	return d
}

// delivery is what was read of a message before its run.
type delivery struct {
	id, tenant string
	n          int // deliveries so far, this one included
	md         *jetstream.MsgMetadata
}

func (c *Consumer[Req, State]) handle(ctx context.Context, msg jetstream.Msg, lim limits) consume.Verdict {
	d := delivery{n: 1}
	if md, err := msg.Metadata(); err == nil {
		d.md, d.n = md, int(md.NumDelivered)
	}
	stop := inProgress(msg, lim.ackWait/2)
	v := c.run(ctx, msg, &d)
	stop()
	if v.Action == consume.Retry && lim.maxDeliver > 0 && d.n >= lim.maxDeliver {
		v = consume.Verdict{Action: consume.Drop, Outcome: v.Outcome,
			Err: fmt.Errorf("%w (%d): %w", ErrDeliveriesExhausted, d.n, cmp.Or(v.Err, refusal(v)))}
	}
	log := c.cfg.Logger.With("workflow", c.workflow.Name(), "subject", msg.Subject(), "tenant", d.tenant, "key", d.id,
		"deliveries", d.n, "action", v.Action.String())
	switch v.Action {
	case consume.Ack:
		if err := msg.DoubleAck(ctx); err != nil {
			log.Warn("acknowledgement not confirmed; the message will be delivered again and replay", "err", err)
		}
	case consume.Retry:
		delay := lim.delay(v, d.n)
		log.Warn("message to be delivered again", "delay", delay, "err", errors.Join(v.Err, msg.NakWithDelay(delay)))
	case consume.Drop:
		if err := c.deadLetter(ctx, msg, d, v); err != nil {
			// Terminating a message whose dead letter is not stored
			// would lose it: leave it to a later delivery.
			delay := lim.delay(v, d.n)
			log.Error("dead letter not published; the message is kept", "delay", delay, "err", errors.Join(v.Err, err, msg.NakWithDelay(delay)))
			return v
		}
		log.Error("message given up", "dead_letter", c.cfg.DeadLetter, "err", errors.Join(v.Err, msg.TermWithReason(reason(v))))
	case consume.Abandon:
		log.Warn("message left to be delivered again after its ack wait", "err", v.Err)
	}
	return v
}

// inProgress tells JetStream every period, until stop is called, that msg
// is still being worked on, so that a run longer than the consumer's
// AckWait is not delivered again meanwhile. A zero period does nothing.
func inProgress(msg jetstream.Msg, period time.Duration) (stop func()) {
	if period <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				// A lost one costs a redelivery, which the key's
				// lease refuses while this run lasts.
				_ = msg.InProgress()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// refusal is the error of a Retry verdict whose run was refused the key.
func refusal(v consume.Verdict) error {
	if v.Outcome == nil {
		return errors.New("natsphase: retried")
	}
	return fmt.Errorf("natsphase: key %s", v.Outcome.Kind)
}

// reason is a dropped message's reason, for its advisory and dead letter:
// one line (a header holds no line break), at most 1000 bytes.
func reason(v consume.Verdict) string {
	r := v.Action.String()
	if v.Err != nil {
		r = strings.Join(strings.Fields(v.Err.Error()), " ")
	}
	if len(r) > 1000 {
		r = strings.ToValidUTF8(r[:1000], "")
	}
	return r
}

// deadLetter publishes msg to Config.DeadLetter, if set, and waits for
// the stream to store it.
func (c *Consumer[Req, State]) deadLetter(ctx context.Context, msg jetstream.Msg, d delivery, v consume.Verdict) error {
	if c.cfg.DeadLetter == "" {
		return nil
	}
	// A consumer stopping still stores the letter before it terminates
	// the message.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	letter := nats.NewMsg(c.cfg.DeadLetter)
	letter.Data = msg.Data()
	for k, vs := range msg.Headers() {
		// JetStream's own headers (an expected sequence, a rollup, a TTL)
		// would apply to the dead letter's stream, or refuse it.
		if !strings.HasPrefix(k, "Nats-") {
			letter.Header[k] = vs
		}
	}
	if id := cmp.Or(d.id, msg.Headers().Get(jetstream.MsgIDHeader)); id != "" {
		letter.Header.Set(jetstream.MsgIDHeader, id)
	}
	if d.tenant != "" {
		letter.Header.Set(TenantHeader, d.tenant)
	}
	letter.Header.Set(ReasonHeader, reason(v))
	letter.Header.Set(SubjectHeader, msg.Subject())
	letter.Header.Set(DeliveriesHeader, strconv.Itoa(d.n))
	if d.md != nil {
		letter.Header.Set(SequenceHeader, fmt.Sprintf("%s:%d", d.md.Stream, d.md.Sequence.Stream))
	}
	_, err := c.cfg.JetStream.PublishMsg(ctx, letter)
	return err
}

func (c *Consumer[Req, State]) run(ctx context.Context, msg jetstream.Msg, d *delivery) consume.Verdict {
	var err error
	if d.id, err = c.cfg.ID(msg); err != nil {
		return consume.ReadFailed(fmt.Errorf("natsphase: message id: %w", err))
	}
	if d.tenant, err = c.cfg.Tenant(msg); err != nil {
		return consume.ReadFailed(fmt.Errorf("natsphase: tenant: %w", err))
	}
	req, err := c.cfg.Decode(msg)
	if err != nil {
		return consume.ReadFailed(fmt.Errorf("natsphase: decode: %w", err))
	}
	return consume.Run(ctx, c.client, c.workflow, d.tenant, d.id, req)
}
