package natsphase_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atomicphase/atomicphase/internal/pgtest"
	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/natsphase"
	"github.com/atomicphase/atomicphase/phase"
)

// outage makes the database of pool refuse connections and ends those it
// has (down), or lets it take connections again.
func outage(t *testing.T, pool *pgxpool.Pool, down bool) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	admin, err := pgx.Connect(ctx, pgtest.Server(t).AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	db := pool.Config().ConnConfig.Database
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s WITH ALLOW_CONNECTIONS %t`, pgx.Identifier{db}.Sanitize(), !down)); err != nil {
		t.Fatal(err)
	}
	if down {
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, db); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor polls cond until it holds, or fails the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after %v for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gaps returns the pauses between successive times.
func gaps(at []time.Time) []time.Duration {
	var g []time.Duration
	for i := 1; i < len(at); i++ {
		g = append(g, at[i].Sub(at[i-1]))
	}
	return g
}

// TestAStoreOutageWhileReadingAMessageRetriesAndShipsOnce takes the
// database down while the consumer's ID, Tenant or Decode function looks
// something up in it and says so with phase.ErrUnavailable, as the HTTP
// handler's Tenant and Decode do. The message is nakked with a growing
// pause, not terminated, and once the database is back it is shipped
// once.
func TestAStoreOutageWhileReadingAMessageRetriesAndShipsOnce(t *testing.T) {
	t.Parallel()
	for _, read := range []string{"id", "tenant", "decode"} {
		t.Run(read, func(t *testing.T) {
			t.Parallel()
			e := setup(t, options{lookup: func(ctx context.Context, pool *pgxpool.Pool, name string, msg jetstream.Msg) error {
				if name != read {
					return nil
				}
				var n int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&n); err != nil {
					return fmt.Errorf("looking up shipments: %w: %w", phase.ErrUnavailable, err)
				}
				return nil
			}})
			outage(t, e.pool, true)
			t.Cleanup(func() { outage(t, e.pool, false) })
			e.publish(t, "order-3", "o3")
			waitFor(t, 20*time.Second, "three deliveries during the outage", func() bool { return len(e.delivered("order-3")) >= 3 })
			outage(t, e.pool, false)
			e.settled(t)
			e.shipped(t, 1)
			if keys, calls := e.carrier.count(); keys != 1 || calls != 1 {
				t.Errorf("the carrier got %d calls under %d keys, want one", calls, keys)
			}
			if letters := e.deadLetters(t); len(letters) != 0 {
				t.Errorf("%d dead letters, want none: %v", len(letters), letters[0].Header)
			}
			// Backoff: at least 1 s after the first failure, 1.5 s after
			// the second (2 s less the jitter).
			g := gaps(e.delivered("order-3"))
			if g[0] < 950*time.Millisecond || g[1] < 1450*time.Millisecond {
				t.Errorf("pauses between deliveries %v, want about 1 s and then 1.5 to 2 s", g)
			}
		})
	}
}

// TestAMessageThatKeepsFailingBacksOffAndEndsAsADeadLetter sends a
// shipment the carrier keeps refusing. Each delivery is retried after a
// longer pause (the consumer's own BackOff when it has one), until the
// consumer's MaxDeliver: then the message is published to the dead-letter
// stream, with its id, tenant and reason, and terminated, and its key is
// left unfinished. Published back once the carrier recovers, the dead
// letter ships under the same key, once.
func TestAMessageThatKeepsFailingBacksOffAndEndsAsADeadLetter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		consumer jetstream.ConsumerConfig
		// min and max bound each pause between deliveries.
		min, max []time.Duration
	}{
		{"the library's backoff", jetstream.ConsumerConfig{MaxDeliver: 3},
			[]time.Duration{950 * time.Millisecond, 1450 * time.Millisecond}, []time.Duration{1900 * time.Millisecond, 3 * time.Second}},
		// Each pause is its BackOff entry, within 40 %: JetStream adds
		// BackOff[n-1] - BackOff[0] to a NakWithDelay's delay, which
		// Consume takes off.
		{"the consumer's BackOff", jetstream.ConsumerConfig{MaxDeliver: 4, BackOff: []time.Duration{400 * time.Millisecond, 1600 * time.Millisecond, 800 * time.Millisecond}},
			[]time.Duration{240 * time.Millisecond, 960 * time.Millisecond, 480 * time.Millisecond}, []time.Duration{560 * time.Millisecond, 2240 * time.Millisecond, 1120 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, options{consumer: tc.consumer, duplicates: 100 * time.Millisecond})
			e.carrier.setDown("o4", true)
			e.publish(t, "order-4", "o4")
			waitFor(t, 20*time.Second, "a dead letter", func() bool { return len(e.deadLetters(t)) > 0 })
			e.settled(t)
			time.Sleep(2 * time.Second) // no delivery comes after the dead letter

			at := e.delivered("order-4")
			if len(at) != tc.consumer.MaxDeliver {
				t.Fatalf("%d deliveries, want MaxDeliver, %d", len(at), tc.consumer.MaxDeliver)
			}
			for i, g := range gaps(at) {
				if g < tc.min[i] || g > tc.max[i] {
					t.Errorf("pause %d was %v, want between %v and %v", i+1, g, tc.min[i], tc.max[i])
				}
			}
			letters := e.deadLetters(t)
			if len(letters) != 1 {
				t.Fatalf("%d dead letters, want 1", len(letters))
			}
			l := letters[0]
			want := map[string]string{
				natsphase.KeyHeader:        "order-4",
				jetstream.MsgIDHeader:      "order-4:SHIPMENTS:1:" + strconv.Itoa(tc.consumer.MaxDeliver),
				natsphase.TenantHeader:     "shipping",
				natsphase.SubjectHeader:    "shipments",
				natsphase.SequenceHeader:   "SHIPMENTS:1",
				natsphase.DeliveriesHeader: strconv.Itoa(tc.consumer.MaxDeliver),
			}
			for h, v := range want {
				if got := l.Header.Get(h); got != v {
					t.Errorf("dead letter's %s = %q, want %q", h, got, v)
				}
			}
			if r := l.Header.Get(natsphase.ReasonHeader); !strings.Contains(r, "cannot ship o4") {
				t.Errorf("dead letter's reason %q does not say the carrier refused", r)
			}
			row, err := e.client.Inspect(t.Context(), "shipping", "order-4")
			if err != nil {
				t.Fatal(err)
			}
			if row.FinishedAt != nil || row.Hold != "" || row.LeaseLeft != 0 || row.Attempts != tc.consumer.MaxDeliver {
				t.Errorf("key finished at %v, hold %q, lease left %v, %d attempts; want it unfinished, free, after %d attempts",
					row.FinishedAt, row.Hold, row.LeaseLeft, row.Attempts, tc.consumer.MaxDeliver)
			}

			// The operator's way back: publish the dead letter to its
			// subject once the carrier recovered.
			e.carrier.setDown("o4", false)
			back := nats.NewMsg(l.Header.Get(natsphase.SubjectHeader))
			back.Data = l.Data
			back.Header.Set(jetstream.MsgIDHeader, l.Header.Get(natsphase.KeyHeader))
			if _, err := e.js.PublishMsg(t.Context(), back); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 20*time.Second, "the key to finish", func() bool {
				row, err := e.client.Inspect(t.Context(), "shipping", "order-4")
				return err == nil && row.FinishedAt != nil
			})
			e.settled(t)
			e.shipped(t, 1)
			if keys, calls := e.carrier.count(); keys != 1 || calls != tc.consumer.MaxDeliver+1 {
				t.Errorf("the carrier got %d calls under %d keys, want %d under one", calls, keys, tc.consumer.MaxDeliver+1)
			}
		})
	}
}

// TestAMalformedMessageIsADeadLetterAtOnce publishes a payload that does
// not decode: it is published to the dead-letter stream and terminated
// at its first delivery, and no key is stored.
func TestAMalformedMessageIsADeadLetterAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	if _, err := e.js.Publish(t.Context(), "shipments", []byte(`{"order":`), jetstream.WithMsgID("order-5")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a dead letter", func() bool { return len(e.deadLetters(t)) > 0 })
	e.settled(t)
	time.Sleep(1500 * time.Millisecond) // no delivery comes after the dead letter
	if n := len(e.delivered("order-5")); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
	l := e.deadLetters(t)[0]
	if r := l.Header.Get(natsphase.ReasonHeader); !strings.Contains(r, "decode") || string(l.Data) != `{"order":` {
		t.Errorf("dead letter %q with reason %q, want the payload and a decoding error", l.Data, r)
	}
	if _, err := e.client.Inspect(t.Context(), "shipping", "order-5"); !errors.Is(err, keyrow.ErrNotFound) {
		t.Errorf("Inspect: %v, want no key stored", err)
	}
	e.shipped(t, 0)
}

// TestAMessageWhoseDeadLetterCannotBeStoredIsKept drops a malformed
// message while no stream captures the dead-letter subject: the message
// is nakked, not terminated, and delivered again until the dead letter is
// stored.
func TestAMessageWhoseDeadLetterCannotBeStoredIsKept(t *testing.T) {
	t.Parallel()
	e := setup(t, options{deadStreamLater: true})
	if _, err := e.js.Publish(t.Context(), "shipments", []byte(`not json`), jetstream.WithMsgID("order-6")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "two deliveries", func() bool { return len(e.delivered("order-6")) >= 2 })
	e.createDeadStream(t)
	waitFor(t, 20*time.Second, "a dead letter", func() bool { return len(e.deadLetters(t)) > 0 })
	e.settled(t)
	l := e.deadLetters(t)[0]
	// The first delivery's letter found no stream: had it terminated the
	// message, no later delivery would have stored one.
	if n, _ := strconv.Atoi(l.Header.Get(natsphase.DeliveriesHeader)); n < 2 || string(l.Data) != "not json" {
		t.Errorf("dead letter %q after %d deliveries, want the payload after at least 2", l.Data, n)
	}
}

// TestARunLongerThanAckWaitIsDeliveredOnce ships an order the carrier
// takes 3 s to ship, on a consumer whose AckWait is 1 s: Consume tells
// JetStream the message is in progress while the run lasts, so it is
// delivered once, and acknowledged.
func TestARunLongerThanAckWaitIsDeliveredOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, options{consumer: jetstream.ConsumerConfig{AckWait: time.Second}})
	e.carrier.mu.Lock()
	e.carrier.slow["o7"] = 3 * time.Second
	e.carrier.mu.Unlock()
	e.publish(t, "order-7", "o7")
	e.shippedOnce(t, "order-7")
	if n := len(e.delivered("order-7")); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
}

// shippedOnce waits until the key finishes and every message is settled,
// and checks that the carrier shipped once.
func (e *env) shippedOnce(t *testing.T, key string) {
	t.Helper()
	waitFor(t, 20*time.Second, "the key to finish", func() bool {
		row, err := e.client.Inspect(t.Context(), "shipping", key)
		return err == nil && row.FinishedAt != nil
	})
	e.settled(t)
	e.shipped(t, 1)
	if keys, calls := e.carrier.count(); keys != 1 || calls != 1 {
		t.Errorf("the carrier got %d calls under %d keys, want one", calls, keys)
	}
}

// redrive publishes the dead letter l back to its subject, under its key.
func (e *env) redrive(t *testing.T, l *jetstream.RawStreamMsg) {
	t.Helper()
	back := nats.NewMsg(l.Header.Get(natsphase.SubjectHeader))
	back.Data = l.Data
	back.Header.Set(jetstream.MsgIDHeader, l.Header.Get(natsphase.KeyHeader))
	if _, err := e.js.PublishMsg(t.Context(), back); err != nil {
		t.Fatal(err)
	}
}

// TestARedrivenMessageThatFailsAgainIsASecondDeadLetter publishes back a
// dead letter that fails again, within the dead-letter stream's duplicate
// window: its second dead letter is stored too, under the same key, not
// discarded as a duplicate of the first while the message is terminated.
func TestARedrivenMessageThatFailsAgainIsASecondDeadLetter(t *testing.T) {
	t.Parallel()
	e := setup(t, options{duplicates: 100 * time.Millisecond})
	if _, err := e.js.Publish(t.Context(), "shipments", []byte(`not json`), jetstream.WithMsgID("order-9")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a dead letter", func() bool { return len(e.deadLetters(t)) == 1 })
	time.Sleep(200 * time.Millisecond) // past the shipments stream's duplicate window
	e.redrive(t, e.deadLetters(t)[0])
	waitFor(t, 20*time.Second, "a second dead letter", func() bool { return len(e.deadLetters(t)) == 2 })
	e.settled(t)
	letters := e.deadLetters(t)
	for _, l := range letters {
		if k := l.Header.Get(natsphase.KeyHeader); k != "order-9" {
			t.Errorf("dead letter's key %q, want order-9", k)
		}
	}
	if a, b := letters[0].Header.Get(jetstream.MsgIDHeader), letters[1].Header.Get(jetstream.MsgIDHeader); a == b {
		t.Errorf("both dead letters have Nats-Msg-Id %q", a)
	}
}

// TestAMessageWhoseDeadLetterCannotBeStoredAtItsLastDeliveryStaysInItsStream
// drops a malformed message while no stream captures the dead-letter
// subject, on a consumer whose MaxDeliver is 2. At the last delivery the
// message is neither nakked (JetStream would not deliver it again) nor
// terminated: an error names its stream and sequence, and the message is
// still there to read.
func TestAMessageWhoseDeadLetterCannotBeStoredAtItsLastDeliveryStaysInItsStream(t *testing.T) {
	t.Parallel()
	e := setup(t, options{deadStreamLater: true, consumer: jetstream.ConsumerConfig{MaxDeliver: 2}})
	if _, err := e.js.Publish(t.Context(), "shipments", []byte(`not json`), jetstream.WithMsgID("order-10")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the error naming the message", func() bool {
		return len(e.logs.lines("level=ERROR", "delivers it no more", "stream=SHIPMENTS", "sequence=1", "key=order-10")) == 1
	})
	time.Sleep(1500 * time.Millisecond) // no delivery comes after the last
	if n := len(e.delivered("order-10")); n != 2 {
		t.Errorf("%d deliveries, want MaxDeliver, 2", n)
	}
	stream, err := e.js.Stream(t.Context(), "SHIPMENTS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetMsg(t.Context(), 1)
	if err != nil || string(m.Data) != "not json" {
		t.Fatalf("sequence 1 of SHIPMENTS: %v, %v; want the message", m, err)
	}
}

// TestAMessageWhoseKeyIsInFlightAtItsLastDeliveryWaitsForTheLease takes
// a key with a run that stops as a killed consumer does, keeping a 3 s
// lease, and then delivers its message to a consumer whose MaxDeliver is
// 1. The message is not given up on while the key is in flight: it waits
// for the lease, in progress, and then resumes the key and ships once.
func TestAMessageWhoseKeyIsInFlightAtItsLastDeliveryWaitsForTheLease(t *testing.T) {
	t.Parallel()
	e := setup(t, options{consumer: jetstream.ConsumerConfig{MaxDeliver: 1}})
	killed, err := phase.NewClient(e.pool, &phase.Config{LeaseTTL: 3 * time.Second, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))}, e.workflow)
	if err != nil {
		t.Fatal(err)
	}
	crash := phase.WithInjector(t.Context(), phase.CrashAt(phase.Point{Phase: "recorded", Stage: phase.AfterCommit}))
	if _, err := e.workflow.Run(crash, killed, "shipping", "order-11", shipment{Order: "o11"}); !errors.Is(err, phase.ErrCrash) {
		t.Fatalf("the killed run: %v, want phase.ErrCrash", err)
	}
	e.publish(t, "order-11", "o11")
	e.shippedOnce(t, "order-11")
	if letters := e.deadLetters(t); len(letters) != 0 {
		t.Errorf("%d dead letters, want none: %v", len(letters), letters[0].Header)
	}
}

// unavailable is a provider's 503 with Retry-After.
type unavailable struct{ after time.Duration }

func (u *unavailable) Error() string             { return "carrier: 503 service unavailable" }
func (u *unavailable) RetryAfter() time.Duration { return u.after }

// TestAProviderOutageDuringAStoreOutageIsLoggedAsItIs fails a call with a
// provider's 503 while the database goes down, so that the run cannot
// free its lease. The run's log says the lease was not freed, and it is a
// warning: the message is retried, and ships once the store returns.
func TestAProviderOutageDuringAStoreOutageIsLoggedAsItIs(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	var once sync.Once
	e.carrier.before = func(string) error {
		var err error
		once.Do(func() {
			outage(t, e.pool, true)
			err = &unavailable{after: time.Second}
		})
		return err
	}
	t.Cleanup(func() { outage(t, e.pool, false) })
	e.publish(t, "order-12", "o12")
	waitFor(t, 20*time.Second, "the failed run's log", func() bool { return len(e.logs.lines("run stopped", "key=order-12")) > 0 })
	outage(t, e.pool, false)
	e.settled(t)
	e.shipped(t, 1)
	if l := e.logs.lines("freeing the lease failed"); len(l) == 0 {
		t.Fatalf("no log says freeing the lease failed; the test's outage came too late")
	}
	if l := e.logs.lines("run stopped", "lease not freed", "level=WARN"); len(l) != 1 {
		t.Errorf("%d warnings that the run stopped with its lease not freed, want 1: %q", len(l), e.logs.lines("run stopped"))
	}
	if l := e.logs.lines("lease freed"); len(l) != 0 {
		t.Errorf("logged %q, but the lease was not freed", l)
	}
}
