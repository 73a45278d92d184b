package conformance

import (
	"context"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
)

// Sources the scenarios cite.
const (
	srcIETF    = "draft-ietf-httpapi-idempotency-key-header-07"
	srcStripe  = "Stripe idempotent requests"
	srcRace    = "seeds: the check-then-insert race"
	srcNoCache = "seeds: don't cache 500s"
)

// scenarios in the order a check runs them; retry-after comes last, as it
// judges the answers of all the others.
var scenarios = []Scenario{
	{Name: "key-missing", Source: srcIETF + " §2.7",
		Checks: "a request without Idempotency-Key is refused with 400 and not executed",
		run:    refusedKey(func(c *checker) []string { return nil }, "without a key", missingKey)},
	{Name: "key-empty", Source: srcIETF + " §2.1",
		Checks: "an empty Idempotency-Key is refused with 400 and not executed",
		run:    refusedKey(func(c *checker) []string { return []string{""} }, "an empty key", missingKey)},
	{Name: "key-twice", Source: srcIETF + " §2.1 (RFC 9110 §5.3)",
		Checks: "two Idempotency-Key lines are refused with 400 and not executed",
		run: refusedKey(func(c *checker) []string { return []string{c.key("twice"), c.key("twice")} },
			"two key lines", invalidKey)},
	{Name: "key-too-long", Source: srcStripe + " (255 characters)",
		Checks: "a key of 256 characters is refused with 400 and not executed",
		run: refusedKey(func(c *checker) []string {
			k := c.key("long")
			return []string{k + strings.Repeat("x", keyrow.MaxKeyLength+1-len(k))}
		}, "a 256-character key", invalidKey)},
	{Name: "key-invalid", Source: srcIETF + " §2.1 (RFC 8941 sf-string)",
		Checks: "a key that is not an sf-string (an unterminated quote, a non-ASCII character) is refused with 400 and not executed",
		run:    refusedKey(func(c *checker) []string { return []string{`"` + c.key("invalid") + "é"} }, "an invalid key", invalidKey)},
	{Name: "replay", Source: srcIETF + " §2.6; " + srcStripe,
		Checks: "a retry with the same key and body gets the first status and byte-identical body, marked as a replay",
		run:    checkReplay},
	{Name: "mismatch", Source: srcIETF + " §2.7; " + srcStripe,
		Checks: "the key reused with the other body gets the profile's mismatch status: never the first answer, never a second execution",
		run:    checkMismatch},
	{Name: "in-flight", Source: srcIETF + " §2.7 (409)",
		Checks: "a retry sent while the first request is in flight gets 409 or the first answer, never a second execution",
		run:    func(ctx context.Context, c *checker, o *outcome) { inFlight(ctx, c, o, false) }},
	{Name: "in-flight-mismatch", Source: srcIETF + " §2.7; idemlease and go-idempotency answer 409",
		Checks: "the other body sent while the first request is in flight gets the profile's answer, never an execution",
		run:    func(ctx context.Context, c *checker, o *outcome) { inFlight(ctx, c, o, true) }},
	{Name: "storm", Source: srcRace,
		Checks: "N identical requests at once: one execution; the others 409 or the identical answer; a retry gets the replay",
		run:    func(ctx context.Context, c *checker, o *outcome) { storm(ctx, c, o, nil) }},
	{Name: "server-error", Source: srcNoCache + "; " + srcStripe + " (stores 500s)",
		Checks: "a 5xx is not replayed as final unless the profile allows it; a retry after it may run again",
		run:    checkServerError},
	{Name: "dropped-connection", Source: srcIETF + " §1 (network failures); seeds: the lost response",
		Checks: "the answer is cut by a proxy after the endpoint sent it; the retry gets that answer, not a second execution",
		run:    checkDropped},
	{Name: "scoping", Source: srcStripe + " (keys are scoped to the account)",
		Checks: "the same key from a second caller is a request of its own, never the first caller's answer",
		run:    checkScoping},
	{Name: "restart", Source: "seeds: crash recovery",
		Checks: "the server restarts in the middle of a storm: the key still gets its answer, executed once",
		run: func(ctx context.Context, c *checker, o *outcome) {
			if c.cfg.Restart == nil {
				o.skip("no restart command given (-restart); nothing restarts the server")
				return
			}
			storm(ctx, c, o, c.cfg.Restart)
		}},
	{Name: "retry-after", Source: "RFC 9110 §10.2.3; " + srcIETF + " §2.7",
		Checks: "every 409, 429 and 503 of the check carries a Retry-After of at most an hour",
		run:    checkRetryAfter},
}

const (
	missingKey = iota
	invalidKey
)

// executions reads the endpoint's execution count, or -1 without an
// Executions function; a count that cannot be read fails the scenario.
func (c *checker) executions(ctx context.Context, o *outcome) int64 {
	if c.cfg.Executions == nil {
		return -1
	}
	n, err := c.cfg.Executions(ctx)
	if err != nil {
		o.fail("the execution count could not be read: %v", err)
		return -1
	}
	return n
}

// expectExecutions fails o unless want executions happened since before.
func (c *checker) expectExecutions(ctx context.Context, o *outcome, before, want int64) {
	if before < 0 {
		return
	}
	after := c.executions(ctx, o)
	if after < 0 {
		return
	}
	o.note("", fmt.Sprintf("%d execution(s) counted", after-before))
	if after-before != want {
		o.fail("the endpoint executed %d time(s), want %d", after-before, want)
	}
}

// first sends the request a scenario builds on and fails o unless it
// succeeded.
func (c *checker) first(ctx context.Context, o *outcome, key string) *exchange {
	x := c.send(ctx, request{what: "key " + key + ", body", keys: []string{key}, body: c.cfg.Body})
	o.show(x)
	if !x.success() {
		o.fail("the first request must succeed (2xx) for this scenario to run; check the method, headers and body (-X, -H, -d)")
		return nil
	}
	if x.markedAny() {
		o.fail("the first answer under a new key is marked as a replay")
	}
	return x
}

// isProblem reports whether x is an RFC 9457 problem, of type typ when
// typ is set.
func (o *outcome) checkProblem(x *exchange, typ string) {
	if !o.profile.Problems {
		return
	}
	mt, _, _ := mime.ParseMediaType(x.header.Get("Content-Type"))
	if mt != "application/problem+json" {
		o.fail("the %d is %q, not application/problem+json (RFC 9457)", x.status, mt)
		return
	}
	if typ != "" && !strings.Contains(string(x.resp), strconv.Quote(typ)) {
		o.fail("the problem's type is not %s", typ)
	}
}

func refusedKey(keys func(*checker) []string, what string, kind int) func(context.Context, *checker, *outcome) {
	return func(ctx context.Context, c *checker, o *outcome) {
		before := c.executions(ctx, o)
		x := c.send(ctx, request{what: what + ", body", keys: keys(c), body: c.cfg.Body})
		o.show(x)
		switch {
		case x.err != nil:
			o.fail("no answer: want 400")
		case x.success():
			o.fail("the request was executed: the endpoint does not require a valid key, so a client's retry runs it twice")
		case x.busy() || x.status >= 500:
			o.fail("a client retries a %d, forever: a bad key must be refused with 400", x.status)
		case x.status != http.StatusBadRequest:
			o.fail("want 400 for %s, got %d", what, x.status)
		default:
			typ := o.profile.ProblemTypes.InvalidKey
			if kind == missingKey {
				typ = o.profile.ProblemTypes.MissingKey
			}
			o.checkProblem(x, typ)
		}
		if x.markedAny() {
			o.fail("the refusal is marked as a replay")
		}
		c.expectExecutions(ctx, o, before, 0)
	}
}

func checkReplay(ctx context.Context, c *checker, o *outcome) {
	before := c.executions(ctx, o)
	key := c.key("replay")
	x1 := c.first(ctx, o, key)
	if x1 == nil {
		return
	}
	x2 := c.send(ctx, request{what: "the same again", keys: []string{key}, body: c.cfg.Body})
	o.show(x2)
	c.judgeReplay(o, x1, x2)
	c.expectExecutions(ctx, o, before, 1)
}

// judgeReplay fails o unless x2 replays x1.
func (c *checker) judgeReplay(o *outcome, x1, x2 *exchange) {
	switch {
	case x2.err != nil:
		o.fail("the retry got no answer")
	case x2.status != x1.status:
		o.fail("the retry answered %d, the first request %d", x2.status, x1.status)
	case !x2.sameAnswer(x1):
		o.fail("the retry's body differs from the first answer's at byte %d: a client cannot tell it from a second execution", diffAt(x1.resp, x2.resp))
	case !x2.markedBy(o.profile.ReplayHeader):
		o.fail("the replay is not marked %s: true", o.profile.ReplayHeader)
	}
}

func diffAt(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func checkMismatch(ctx context.Context, c *checker, o *outcome) {
	if c.other == nil {
		o.skip("no other request: %s", c.otherNote)
		return
	}
	before := c.executions(ctx, o)
	key := c.key("mismatch")
	x1 := c.first(ctx, o, key)
	if x1 == nil {
		return
	}
	x2 := c.send(ctx, request{what: "the same key, other body", keys: []string{key}, body: c.other})
	o.show(x2)
	switch {
	case x2.err != nil:
		o.fail("no answer to the other request")
	case x2.sameAnswer(x1) || x2.markedAny():
		o.fail("the other request got the first one's answer: the endpoint does not compare a request with its key's first (no fingerprint), so a client's bug goes unnoticed")
	case x2.success():
		o.fail("the other request was executed under the same key: a second execution")
	case x2.status != o.profile.MismatchStatus:
		o.fail("want %d for a key reused with another request, got %d", o.profile.MismatchStatus, x2.status)
	default:
		o.checkProblem(x2, o.profile.ProblemTypes.KeyReused)
	}
	c.expectExecutions(ctx, o, before, 1)
}

// inFlight sends the request and, while it is in flight, the same again
// (or the other request): one execution, and the answers the profile
// requires. Which of the two requests takes the key first is up to the
// network; each is judged by which one executed.
func inFlight(ctx context.Context, c *checker, o *outcome, other bool) {
	body2, what2 := c.cfg.Body, "the same again, while the first is in flight"
	if other {
		if c.other == nil {
			o.skip("no other request: %s", c.otherNote)
			return
		}
		body2, what2 = c.other, "the same key, other body, while the first is in flight"
	}
	before := c.executions(ctx, o)
	key := c.key("inflight")
	wrote := make(chan struct{})
	var x1 *exchange
	done := make(chan struct{})
	go func() {
		defer close(done)
		x1 = c.send(withWrote(ctx, wrote), request{what: "key " + key + ", body", keys: []string{key}, body: c.cfg.Body})
	}()
	select {
	case <-wrote:
	case <-done:
	}
	// Give the first request a head start, so that it is likelier to hold
	// the key when the second arrives.
	time.Sleep(20 * time.Millisecond)
	var during []*exchange
	for range 3 {
		select {
		case <-done:
		default:
			during = append(during, c.send(ctx, request{what: what2, keys: []string{key}, body: body2}))
			continue
		}
		break
	}
	<-done
	o.show(x1)
	var overlapped []*exchange
	for _, x := range during {
		o.show(x)
		if x.sent.Before(x1.done) {
			overlapped = append(overlapped, x)
		}
	}
	if len(overlapped) == 0 {
		o.skip("the first request was answered in %s, before a second could reach the endpoint: it is too fast to catch in flight from outside", x1.done.Sub(x1.sent).Round(time.Millisecond))
		return
	}
	if !other {
		all := append([]*exchange{x1}, overlapped...)
		c.judgeSameKey(o, all)
		if !slices.ContainsFunc(all, (*exchange).success) {
			o.fail("no request succeeded")
		}
	} else {
		c.judgeOtherInFlight(o, x1, overlapped)
	}
	c.expectExecutions(ctx, o, before, 1)
}

// withWrote returns ctx with a trace that closes wrote once the request is
// written.
func withWrote(ctx context.Context, wrote chan struct{}) context.Context {
	var once sync.Once
	return httptraceWrote(ctx, func() { once.Do(func() { close(wrote) }) })
}

// judgeSameKey fails o unless the answers to requests that share a key and
// a body show one execution: every success identical, at most one not
// marked as a replay, and the rest 409, 429 or 503.
func (c *checker) judgeSameKey(o *outcome, xs []*exchange) {
	var ref *exchange
	unmarked := 0
	for _, x := range xs {
		switch {
		case x.success():
			if ref == nil {
				ref = x
			} else if !x.sameAnswer(ref) {
				o.fail("two successful answers for one key differ (%s and %s): two executions", abbreviate(ref.resp, 40), abbreviate(x.resp, 40))
				return
			}
			// Any marker will do here: the replay scenario checks its name.
			if !x.markedAny() {
				unmarked++
			}
		case x.busy():
			if x.status == http.StatusConflict {
				o.checkProblem(x, o.profile.ProblemTypes.InProgress)
			}
		case x.err != nil:
			o.fail("a request got no answer: %v", x.err)
			return
		default:
			o.fail("a request for a key in flight answered %d; want 409 with Retry-After, or the first answer", x.status)
			return
		}
	}
	if unmarked > 1 {
		o.fail("%d successful answers for one key are not marked as replays: each one is an execution", unmarked)
	}
}

// judgeOtherInFlight fails o unless exactly one of the two payloads ran and
// the other got the profile's answer.
func (c *checker) judgeOtherInFlight(o *outcome, x1 *exchange, others []*exchange) {
	ran := 0
	if x1.success() {
		ran++
	}
	for _, x := range others {
		if x.success() || x.markedAny() {
			ran++
		}
	}
	if ran != 1 {
		o.fail("%d of the two payloads ran under one key; want exactly one", ran)
		return
	}
	for _, x := range append([]*exchange{x1}, others...) {
		if x.success() {
			continue
		}
		if x.err != nil || !o.profile.inFlightMismatch(x.status) {
			o.fail("the payload that did not run got %s; want one of %v", x.got(o.profile.ReplayHeader), o.profile.accepted())
		}
	}
}

// storm sends cfg.Storm identical requests at once under one key, calls
// restart (when set) while they are out, then retries the key until it is
// answered: one execution, and the answers judgeSameKey requires.
func storm(ctx context.Context, c *checker, o *outcome, restart func(context.Context) error) {
	before := c.executions(ctx, o)
	key := c.key("storm")
	restarted := ""
	xs := c.sendTogether(ctx, c.cfg.Storm, request{keys: []string{key}, body: c.cfg.Body}, func() {
		if restart == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
		if err := restart(ctx); err != nil {
			o.fail("the restart failed: %v", err)
		}
		restarted = ", restarting the server meanwhile"
	})
	if restart != nil {
		// Requests cut by the restart got no answer, as a real client's
		// would; the retry below must still find the key's answer.
		xs = slices.DeleteFunc(xs, func(x *exchange) bool { return x.err != nil })
	}
	final := c.settle(ctx, key, c.cfg.Body, "then a retry until answered")
	o.note(fmt.Sprintf("%d× key %s, body, at once%s", c.cfg.Storm, key, restarted), tally(xs, o.profile.ReplayHeader))
	o.show(final)
	if !final.success() {
		o.fail("the retry after the storm was not answered with success: the key's answer was lost")
	}
	all := append(xs, final)
	c.judgeSameKey(o, all)
	if !o.failed() && !final.markedBy(o.profile.ReplayHeader) && slices.ContainsFunc(xs, (*exchange).success) {
		o.fail("the retry after the storm is not marked as a replay")
	}
	c.expectExecutions(ctx, o, before, 1)
}

// tally summarises answers: "1× 201, 19× 409".
func tally(xs []*exchange, replayHeader string) string {
	counts := map[string]int{}
	for _, x := range xs {
		k := strconv.Itoa(x.status)
		switch {
		case x.err != nil:
			k = "no answer"
		case x.success() && x.markedBy(replayHeader):
			k += " replayed"
		}
		counts[k]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d× %s", counts[k], k))
	}
	return strings.Join(parts, ", ")
}

// settle sends body under key until the answer is neither 409, 429 nor
// 503, nor a failure to connect, waiting as Retry-After says (at most a
// second at a time), for at most SettleTimeout; it returns the last answer.
func (c *checker) settle(ctx context.Context, key string, body []byte, what string) *exchange {
	deadline := time.Now().Add(c.cfg.SettleTimeout)
	for {
		x := c.send(ctx, request{what: what, keys: []string{key}, body: body})
		if !(x.busy() || (x.err != nil && ctx.Err() == nil)) || time.Now().After(deadline) {
			return x
		}
		wait := 100 * time.Millisecond
		if d, ok := retryAfter(x.header.Get("Retry-After"), time.Now()); ok && x.err == nil {
			wait = min(max(d, wait), time.Second)
		}
		select {
		case <-ctx.Done():
			return x
		case <-time.After(wait):
		}
	}
}

func checkServerError(ctx context.Context, c *checker, o *outcome) {
	if c.cfg.FailBody == nil {
		o.skip("no failing request given (-d500): pass a body that makes the endpoint answer 5xx to check that server errors are not kept as final")
		return
	}
	key := c.key("fail")
	x1 := c.send(ctx, request{what: "key " + key + ", failing body", keys: []string{key}, body: c.cfg.FailBody})
	o.show(x1)
	if x1.err != nil || x1.status < 500 {
		o.fail("the failing request must be answered with a 5xx for this scenario to run; check -d500")
		return
	}
	if x1.markedAny() {
		o.fail("the first 5xx under a new key is marked as a replay")
	}
	x2 := c.send(ctx, request{what: "the same again", keys: []string{key}, body: c.cfg.FailBody})
	o.show(x2)
	switch {
	case x2.err != nil:
		o.fail("the retry got no answer")
	case x2.markedAny() && !o.profile.ReplaysServerErrors:
		o.fail("the %d was stored and replayed as the key's final answer: a transient failure now fails the key for good; a retry after a 5xx must run again (profile %s)", x1.status, o.profile.Name)
	case x2.markedAny() && !x2.sameAnswer(x1):
		o.fail("the replayed %d differs from the first answer", x1.status)
	}
}

func checkDropped(ctx context.Context, c *checker, o *outcome) {
	p, err := c.startCutter()
	if err != nil {
		o.fail("%v", err)
		return
	}
	defer p.close()
	before := c.executions(ctx, o)
	key := c.key("dropped")
	x1 := c.send(ctx, request{what: "key " + key + ", body, through a proxy that drops the answer", keys: []string{key}, body: c.cfg.Body,
		via: p.url, client: oneShot()})
	fwd := p.forwarded()
	if len(fwd) != 1 {
		o.show(x1)
		o.fail("the proxy forwarded %d requests, want 1", len(fwd))
		return
	}
	up := fwd[0]
	o.note(x1.what, "dropped; the endpoint had answered "+up.got(o.profile.ReplayHeader))
	if x1.err == nil {
		o.fail("the proxy did not drop the answer")
		return
	}
	if !up.success() {
		o.fail("the request must succeed (2xx) for this scenario to run; check -X, -H, -d")
		return
	}
	x2 := c.settle(ctx, key, c.cfg.Body, "the same again, directly")
	o.show(x2)
	c.judgeReplay(o, up, x2)
	c.expectExecutions(ctx, o, before, 1)
}

func checkScoping(ctx context.Context, c *checker, o *outcome) {
	if c.cfg.OtherCaller == nil {
		o.skip("no second caller given (-H2): pass another caller's credentials to check that keys are scoped to their caller")
		return
	}
	before := c.executions(ctx, o)
	key := c.key("scope")
	x1 := c.first(ctx, o, key)
	if x1 == nil {
		return
	}
	x2 := c.send(ctx, request{what: "the same key and body from the second caller", keys: []string{key}, body: c.cfg.Body, caller: 2})
	o.show(x2)
	switch {
	case x2.err != nil:
		o.fail("the second caller got no answer")
	case x2.markedAny() || x2.sameAnswer(x1):
		o.fail("the second caller got the first caller's answer: keys are shared across callers, so one caller's key replays another's data")
	case x2.status == http.StatusConflict || x2.status == o.profile.MismatchStatus:
		o.fail("the second caller's request was refused (%d) because the first caller used the key: keys are not scoped to the caller", x2.status)
	case x2.status >= 500:
		o.fail("the second caller's request failed with %d", x2.status)
	}
	want := int64(1)
	if x2.success() {
		want = 2
	}
	c.expectExecutions(ctx, o, before, want)
}

// maxRetryAfter is the longest Retry-After the check takes for sane.
const maxRetryAfter = time.Hour

func checkRetryAfter(ctx context.Context, c *checker, o *outcome) {
	c.mu.Lock()
	seen := slices.Clone(c.seen)
	c.mu.Unlock()
	checked := 0
	for _, x := range seen {
		if !x.busy() {
			continue
		}
		checked++
		v := x.header.Get("Retry-After")
		d, ok := retryAfter(v, time.Now())
		switch {
		case v == "":
			o.fail("a %d has no Retry-After: a client cannot tell when to retry", x.status)
		case !ok:
			o.fail("a %d has Retry-After %q, neither delay-seconds nor an HTTP-date", x.status, v)
		case d > maxRetryAfter:
			o.fail("a %d has Retry-After %q, over an hour", x.status, v)
		default:
			continue
		}
		o.show(x)
		return
	}
	if checked == 0 {
		o.skip("no 409, 429 or 503 was answered during the check")
		return
	}
	o.note(fmt.Sprintf("%d answers 409, 429 or 503 during the check", checked), "each with a sane Retry-After")
}

// retryAfter parses a Retry-After value, delay-seconds or an HTTP-date, as
// the wait from now.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
		return time.Duration(min(n, 1<<32)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
