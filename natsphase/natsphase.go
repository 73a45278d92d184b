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
// Nats-Msg-Id is unique to the message's delivery given up on
// ("<key>:<stream>:<sequence>:<deliveries>"), so that the dead-letter
// stream never discards a second dead letter of one key as a duplicate;
// publishing it back to its subject with Nats-Msg-Id set to KeyHeader runs
// it under the same key.
const (
	// KeyHeader is the message's id, its idempotency key, when it was read,
	// else the message's own Nats-Msg-Id.
	KeyHeader = "Atomicphase-Key"
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
	// for a later delivery, the completer or an operator. A message whose
	// key is in flight in another run is never given up on: it waits for
	// the key's lease. Consume lowers it to the JetStream consumer's own
	// MaxDeliver, after which JetStream would stop delivering the message
	// without a word. Defaults to DefaultMaxDeliver; -1 retries for as
	// long as JetStream delivers.
	MaxDeliver int
	// DeadLetter is the subject, captured by a stream of its own, to
	// which every message dropped or given up on is published through
	// JetStream, with its payload, its headers and the headers above
	// (TenantHeader, ReasonHeader, ...), before it is terminated. A
	// message whose dead letter could not be published is retried, not
	// terminated; at the JetStream consumer's last delivery (Consume) it
	// is left unacknowledged in its stream, and an error names its stream
	// and sequence. Defaults to none: the message is terminated with the
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
// exceed the client's RunTimeout (messages fetched behind it wait
// unreported: see docs/consumers.md); it gives a message up at cons's
// MaxDeliver when that is below Config.MaxDeliver; and when cons has a
// BackOff, a retried message is delivered again after the pause BackOff
// sets for its delivery (or the pause the run asked for, if longer: the
// time left on the lease of a key in flight, a provider's Retry-After)
// instead of consume.Verdict.Backoff's.
//
// At cons's last delivery, nothing is left to JetStream's silence: a
// message whose key is in flight waits, in progress, for the key's lease
// and runs again; a message whose dead letter cannot be stored is left
// unacknowledged, and an error names its stream and sequence, where the
// stream keeps it (under limits retention, until its limits remove it).
func (c *Consumer[Req, State]) Consume(ctx context.Context, cons jetstream.Consumer, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	lim := limits{maxDeliver: c.cfg.MaxDeliver}
	if info := cons.CachedInfo(); info != nil {
		if md := info.Config.MaxDeliver; md > 0 && (lim.maxDeliver == -1 || md < lim.maxDeliver) {
			lim.maxDeliver = md
		}
		if md := info.Config.MaxDeliver; md > 0 {
			lim.lastDeliver = md
		}
		lim.backoff = info.Config.BackOff
		lim.ackWait = info.Config.AckWait
		lim.progress = lim.ackWait / 2
		if len(lim.backoff) > 0 {
			// A BackOff replaces AckWait: delivery n waits BackOff[n-1].
			lim.progress = slices.Min(lim.backoff) / 2
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
// returned as a Drop whose Err wraps ErrDeliveriesExhausted, unless the
// message's key is in flight in another run. Handle does
// not know the consumer's AckWait: set it above the client's RunTimeout,
// or a message still being run is delivered again (and retried while its
// key is in flight).
func (c *Consumer[Req, State]) Handle(ctx context.Context, msg jetstream.Msg) consume.Verdict {
	return c.handle(ctx, msg, limits{maxDeliver: c.cfg.MaxDeliver})
}

// limits are the JetStream consumer's settings a delivery is settled by.
type limits struct {
	maxDeliver  int             // -1: no limit
	lastDeliver int             // the consumer's own MaxDeliver; 0: unknown or none
	backoff     []time.Duration // the consumer's BackOff, if any
	ackWait     time.Duration   // the consumer's AckWait, BackOff[0] with a BackOff
	progress    time.Duration   // how often to report a run in progress; 0: never
}

// delay is the pause, from now, before the next delivery of a message
// whose delivery n got v, elapsed after that delivery: the consumer's
// BackOff for delivery n when it has one, counted from the delivery as
// JetStream counts it, or the pause the run asked for (the time left on
// the lease of a key in flight, a provider's Retry-After) if longer.
func (l limits) delay(v consume.Verdict, n int, elapsed time.Duration) time.Duration {
	if len(l.backoff) == 0 {
		return v.Backoff(n)
	}
	d := max(l.backoffOf(n)-elapsed, 0)
	if v.Outcome != nil || v.Delay > consume.DefaultRetryDelay {
		// The run asked: DefaultRetryDelay alone is no request, and
		// BackOff replaces it.
		d = max(d, v.Delay)
	}
	return d
}

// backoffOf is the consumer's BackOff for delivery n.
func (l limits) backoffOf(n int) time.Duration {
	return l.backoff[min(max(n-1, 0), len(l.backoff)-1)]
}

// nakDelay is the delay to nak delivery n with so that the next delivery
// comes d later. JetStream's NakWithDelay does not wait d: it marks the
// delivery as sent d - AckWait from now, and redelivers it once the ack
// wait of delivery n has passed since, which with a BackOff is
// BackOff[n-1], not AckWait (BackOff[0]). Naked with d, the message would
// come back after d + BackOff[n-1] - BackOff[0].
func (l limits) nakDelay(d time.Duration, n int) time.Duration {
	if len(l.backoff) == 0 || l.ackWait <= 0 {
		return d
	}
	// Never 0, which JetStream reads as a nak without delay.
	return max(d-l.backoffOf(n)+l.ackWait, time.Millisecond)
}

// last reports whether delivery n is the last JetStream makes: after it,
// JetStream stops delivering the message whatever it is told.
func (l limits) last(n int) bool {
	return l.lastDeliver > 0 && n >= l.lastDeliver
}

// inFlight reports whether v retries a message whose key another run
// holds.
func inFlight(v consume.Verdict) bool {
	return v.Action == consume.Retry && v.Outcome != nil && v.Outcome.Kind == phase.OutcomeInFlight
}

// delivery is what was read of a message before its run.
type delivery struct {
	id, tenant string
	n          int // deliveries so far, this one included
	md         *jetstream.MsgMetadata
}

func (c *Consumer[Req, State]) handle(ctx context.Context, msg jetstream.Msg, lim limits) consume.Verdict {
	start := time.Now()
	d := delivery{n: 1}
	if md, err := msg.Metadata(); err == nil {
		d.md, d.n = md, int(md.NumDelivered)
	}
	stop := inProgress(msg, lim.progress)
	v := c.run(ctx, msg, &d)
	for inFlight(v) && lim.last(d.n) && lim.progress > 0 {
		// The key's holder may have died: JetStream delivers the message
		// no more, and it is not to be given up on while the key is only
		// in flight. Wait for the lease here, the message kept in
		// progress, and run it again.
		t := time.NewTimer(v.Delay)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
		v = c.run(ctx, msg, &d)
	}
	stop()
	if v.Action == consume.Retry && !inFlight(v) && lim.maxDeliver > 0 && d.n >= lim.maxDeliver {
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
		delay := lim.delay(v, d.n, time.Since(start))
		if lim.last(d.n) {
			// A key still in flight when the consumer stops: the
			// message stays unacknowledged in its stream.
			c.kept(log, d, "the message's last delivery ended with its key in flight", v.Err)
			return v
		}
		log.Warn("message to be delivered again", "delay", delay, "err", errors.Join(v.Err, msg.NakWithDelay(lim.nakDelay(delay, d.n))))
	case consume.Drop:
		if err := c.deadLetter(ctx, msg, d, v); err != nil {
			if lim.last(d.n) {
				// A nak would not bring it back, and a term would hide
				// it: leave it unacknowledged, where its stream keeps it.
				c.kept(log, d, "dead letter not stored at the message's last delivery", errors.Join(v.Err, err))
				return v
			}
			// Terminating a message whose dead letter is not stored
			// would lose it: leave it to a later delivery.
			delay := lim.delay(v, d.n, time.Since(start))
			log.Error("dead letter not published; the message is kept", "delay", delay, "err", errors.Join(v.Err, err, msg.NakWithDelay(lim.nakDelay(delay, d.n))))
			return v
		}
		log.Error("message given up", "dead_letter", c.cfg.DeadLetter, "err", errors.Join(v.Err, msg.TermWithReason(reason(v))))
	case consume.Abandon:
		log.Warn("message left to be delivered again after its ack wait", "err", v.Err)
	}
	return v
}

// kept logs, at error level, a message that JetStream delivers no more
// and that was neither acknowledged nor terminated: its stream keeps it
// (under limits retention, until the stream's limits remove it), and the
// log names its stream and sequence so that an operator can read it back
// and publish it again.
func (c *Consumer[Req, State]) kept(log *slog.Logger, d delivery, what string, err error) {
	var stream string
	var seq uint64
	if d.md != nil {
		stream, seq = d.md.Stream, d.md.Sequence.Stream
	}
	log.Error(what+"; JetStream delivers it no more, and its stream keeps it", "stream", stream, "sequence", seq, "err", err)
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
	key := cmp.Or(d.id, msg.Headers().Get(jetstream.MsgIDHeader))
	if key != "" {
		letter.Header.Set(KeyHeader, key)
	}
	// One id per message and delivery given up on: a redriven message that
	// fails again, within the dead-letter stream's duplicate window, is a
	// second dead letter, not a duplicate of the first.
	letterID := fmt.Sprintf("%s:%d", key, d.n)
	if d.md != nil {
		letterID = fmt.Sprintf("%s:%s:%d:%d", key, d.md.Stream, d.md.Sequence.Stream, d.n)
	}
	letter.Header.Set(jetstream.MsgIDHeader, letterID)
	if d.tenant != "" {
		letter.Header.Set(TenantHeader, d.tenant)
	}
	letter.Header.Set(ReasonHeader, reason(v))
	letter.Header.Set(SubjectHeader, msg.Subject())
	letter.Header.Set(DeliveriesHeader, strconv.Itoa(d.n))
	if d.md != nil {
		letter.Header.Set(SequenceHeader, fmt.Sprintf("%s:%d", d.md.Stream, d.md.Sequence.Stream))
	}
	ack, err := c.cfg.JetStream.PublishMsg(ctx, letter)
	if err != nil || !ack.Duplicate {
		return err
	}
	// This very letter was stored before (a publish whose ack was lost):
	// it counts only if its stream still has it.
	dead, err := c.cfg.JetStream.Stream(ctx, ack.Stream)
	if err == nil {
		_, err = dead.GetMsg(ctx, ack.Sequence)
	}
	if err != nil {
		return fmt.Errorf("natsphase: the dead letter is a duplicate of sequence %d of %s, which cannot be read: %w", ack.Sequence, ack.Stream, err)
	}
	return nil
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
