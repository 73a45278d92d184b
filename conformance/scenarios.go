package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
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
		Checks: "a request without Idempotency-Key is refused (400) and not executed",
		run:    refusedKey(func(c *checker) []string { return nil }, "without a key", missingKey)},
	{Name: "key-empty", Source: srcIETF + " §2.1",
		Checks: "an empty Idempotency-Key is refused (400) and not executed",
		run:    refusedKey(func(c *checker) []string { return []string{""} }, "with an empty key", missingKey)},
	{Name: "key-twice", Source: srcIETF + " §2.1 (RFC 9110 §5.3)",
		Checks: "two Idempotency-Key lines are refused (400), or work as one key",
		run: refusedKey(func(c *checker) []string { return []string{c.key("twice"), c.key("twice")} },
			"with two key lines", invalidKey)},
	{Name: "key-too-long", Source: srcStripe + " (255 characters)",
		Checks: "a key of 256 characters is refused (400), or works as a key and is not cut to match another",
		run:    refusedKey(func(c *checker) []string { return []string{longKey(c.key("long"), 'x')} }, "with a 256-character key", longKeyKind)},
	{Name: "key-invalid", Source: srcIETF + " §2.1 (RFC 8941 sf-string)",
		Checks: "a key that is not an sf-string (an unterminated quote, a non-ASCII character) is refused (400), or works as an opaque key",
		run:    refusedKey(func(c *checker) []string { return []string{`"` + c.key("invalid") + "é"} }, "with a key that is not an sf-string", invalidKey)},
	{Name: "replay", Source: srcIETF + " §2.6; " + srcStripe,
		Checks: "a retry with the same key and body gets the first status and byte-identical body, marked as a replay",
		run:    checkReplay},
	{Name: "mismatch", Source: srcIETF + " §2.7; " + srcStripe,
		Checks: "the key reused with the other body is refused: never the first answer, never a second execution",
		run:    checkMismatch},
	{Name: "in-flight", Source: srcIETF + " §2.7 (409)",
		Checks: "a retry sent while the first request is in flight gets 409 or the first answer, never a second execution",
		run:    func(ctx context.Context, c *checker, o *outcome) { inFlight(ctx, c, o, false) }},
	{Name: "in-flight-mismatch", Source: srcIETF + " §2.7; idemlease and go-idempotency answer 409",
		Checks: "the other body sent while the first request is in flight is refused, never executed",
		run:    func(ctx context.Context, c *checker, o *outcome) { inFlight(ctx, c, o, true) }},
	{Name: "storm", Source: srcRace,
		Checks: "N identical requests at once: one execution; the others 409 or the identical answer; a retry gets the replay",
		run:    checkStorm},
	{Name: "server-error", Source: srcNoCache + "; " + srcStripe + " (stores 500s)",
		Checks: "a 5xx is not replayed as final unless the profile allows it; a replayed 5xx is the first one",
		run:    checkServerError},
	{Name: "dropped-connection", Source: srcIETF + " §1 (network failures); seeds: the lost response",
		Checks: "the answer is cut by a proxy after the endpoint sent it; the retry gets that answer, not a second execution",
		run:    checkDropped},
	{Name: "scoping", Source: srcStripe + " (keys are scoped to the account)",
		Checks: "the same key from a second caller is a request of its own, never the first caller's answer",
		run:    checkScoping},
	{Name: "restart", Source: "seeds: crash recovery",
		Checks: "the server restarts while an execution is in flight in a storm: the key still gets its answer, executed once",
		run:    checkRestart},
	{Name: "retry-after", Source: "RFC 9110 §10.2.3; " + srcIETF + " §2.7",
		Checks: "every 409, 429 and 503 to a request a client retries carries a Retry-After of at most an hour",
		run:    checkRetryAfter},
}

// What a key scenario sends: no usable key, or a key a profile may take as
// opaque.
const (
	missingKey = iota
	invalidKey
	longKeyKind
)

// controlRequest returns the answer to Body under a new, valid key, sent
// once per check: a key scenario's refusal says something of the key only
// when this one succeeded. It is sent before the first key scenario reads
// the execution count, so no scenario counts its execution.
func (c *checker) controlRequest(ctx context.Context) *exchange {
	c.controlOnce.Do(func() {
		key := c.key("control")
		c.control = c.send(ctx, request{what: "key " + key + ", body (the same body under a valid key)", keys: []string{key}, body: c.cfg.Body})
	})
	return c.control
}

// longKey returns a key of keyrow.MaxKeyLength+1 characters that starts
// with k and ends with last.
func longKey(k string, last byte) string {
	return k + strings.Repeat("x", keyrow.MaxKeyLength-len(k)) + string(last)
}

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

// since returns how many executions the Executions count shows since
// before, or -1 without a count. A count that went down fails o: the
// endpoint lost it, and with it its state, and it cannot judge the
// scenario.
func (c *checker) since(ctx context.Context, o *outcome, before int64) int64 {
	if before < 0 {
		return -1
	}
	after := c.executions(ctx, o)
	if after < 0 {
		return -1
	}
	if after < before {
		o.fail("the execution count went down from %d to %d during the scenario: the endpoint lost its state (as across a restart), and the count cannot say how many times it executed", before, after)
		return -1
	}
	return after - before
}

// expectExecutions fails o unless want executions happened since before,
// and returns how many did, or -1 without a count.
func (c *checker) expectExecutions(ctx context.Context, o *outcome, before, want int64) int64 {
	n := c.since(ctx, o, before)
	if n < 0 {
		return n
	}
	o.res.Executions = &n
	o.note("", fmt.Sprintf("%d execution(s) counted", n))
	switch {
	case n == 0 && want > 0:
		// Requests were answered with success and nothing was counted:
		// the count, not the endpoint, is the likelier to be wrong.
		o.fail("the execution count did not move, though the answers show %d execution(s): check that the count (-effects) counts this endpoint's executions", want)
	case n != want:
		o.fail("the endpoint executed %d time(s) by its execution count; want %d", n, want)
	}
	return n
}

// inferred says what answers that differ for one key show: with n
// executions counted, what the count shows; without a count (n < 0), the
// inference the kit draws from the answers alone.
func inferred(n int64, inference string) string {
	switch {
	case n < 0:
		return "the kit infers " + inference
	case n <= 1:
		return fmt.Sprintf("%d execution(s) counted: the endpoint answered a replay that is not its first answer", n)
	default:
		return fmt.Sprintf("%d executions counted: the endpoint executed the request more than once", n)
	}
}

// first sends the request a scenario builds on and fails o unless it
// succeeded.
func (c *checker) first(ctx context.Context, o *outcome, key string) *exchange {
	x := c.send(ctx, request{what: "key " + key + ", body", keys: []string{key}, body: c.cfg.Body})
	o.show(x)
	if !x.success() {
		o.fail("the first request was %s, not 2xx: the scenario needs it to succeed; %s", brief(x), c.hint(x))
		return nil
	}
	if x.markedAny() {
		o.differ("the first answer under a new key is marked as a replay (%s)", x.marker())
	}
	return x
}

// brief says how a request was answered: "answered 405", or "not
// answered (why)".
func brief(x *exchange) string {
	if x.err != nil {
		return "not answered (" + x.err.Error() + ")"
	}
	return "answered " + strconv.Itoa(x.status)
}

// hint says what to check when a request a scenario needs did not
// succeed: the request timeout when it ran out, else the request.
func (c *checker) hint(x *exchange) string {
	if x.timedOut {
		return fmt.Sprintf("the endpoint did not answer within the request timeout, %s (-request-timeout)", c.cfg.RequestTimeout)
	}
	return "check the URL, method, headers and body (-X, -H, -d)"
}

// checkProblem notes an error answer that is not the profile's RFC 9457
// problem, of type typ when typ is set.
func (o *outcome) checkProblem(x *exchange, typ string) {
	if !o.profile.Problems {
		return
	}
	mt, _, _ := mime.ParseMediaType(x.header.Get("Content-Type"))
	if mt != "application/problem+json" {
		o.differ("the %d is %q; the profile answers application/problem+json (RFC 9457)", x.status, mt)
		return
	}
	if typ != "" && !strings.Contains(string(x.resp), strconv.Quote(typ)) {
		o.differ("the %d's problem type is not %s", x.status, typ)
	}
}

// refusedKey judges a request sent with keys: refused with 400 and not
// executed. A missing or empty key that executes is unsafe in every
// profile; another key the endpoint accepts must then work as a key (its
// retry replayed, a longer key not cut to match another), and differs from
// a profile without OpaqueKeys.
func refusedKey(keys func(*checker) []string, what string, kind int) func(context.Context, *checker, *outcome) {
	return func(ctx context.Context, c *checker, o *outcome) {
		control := c.controlRequest(ctx)
		before := c.executions(ctx, o)
		sent := keys(c)
		x := c.send(ctx, request{what: "a request " + what + ", body", keys: sent, body: c.cfg.Body})
		o.show(x)
		want := int64(0)
		switch {
		case x.err != nil:
			o.fail("the request got no answer: %v", x.err)
		case x.success() && kind == missingKey:
			o.fail("a request %s was answered %d: it was executed without a key", what, x.status)
			want = 1
		case x.success():
			want = c.acceptedKey(ctx, o, before, x, sent, what, kind)
		case !control.success():
			// A refusal says something of the key only when the same body
			// under a valid key is executed: else it may refuse the body.
			o.show(control)
			o.fail("a request %s was answered %d, but so was the same body under a valid key (%s): the refusal cannot be told from a refusal of the body; the scenario needs the body to succeed; %s",
				what, x.status, brief(control), c.hint(control))
		case x.busy() || x.status >= 500:
			o.differ("a request %s was answered %d, which clients retry, with the same key; the profile refuses it for good with 400", what, x.status)
		case x.status != http.StatusBadRequest:
			o.differ("a request %s was answered %d; the profile refuses it with 400", what, x.status)
		default:
			typ := o.profile.ProblemTypes.InvalidKey
			if kind == missingKey {
				typ = o.profile.ProblemTypes.MissingKey
			}
			o.checkProblem(x, typ)
		}
		if !x.success() && x.markedAny() {
			o.differ("the refusal is marked as a replay (%s)", x.marker())
		}
		c.expectExecutions(ctx, o, before, want)
	}
}

// acceptedKey judges a key the endpoint accepted where the profile may
// refuse it: the same request again must be its replay, and a long key
// must not answer for another that shares its first 255 characters. It
// returns the executions expected.
func (c *checker) acceptedKey(ctx context.Context, o *outcome, before int64, x *exchange, sent []string, what string, kind int) int64 {
	x2 := c.send(ctx, request{what: "the same again", keys: sent, body: c.cfg.Body})
	o.show(x2)
	c.judgeReplay(ctx, o, before, x, x2)
	want := int64(1)
	if kind == longKeyKind {
		other := longKey(sent[0][:keyrow.MaxKeyLength], 'y')
		x3 := c.separate(ctx, o, x, request{what: "another 256-character key with the same first 255", keys: []string{other}, body: c.cfg.Body},
			"another key that shares the first 255 characters", "the endpoint answers one key with another's")
		if x3 != nil && x3.success() {
			want++
		}
	}
	if !o.profile.OpaqueKeys && !o.failed() {
		o.differ("a request %s was accepted (%d) and its key worked; the profile refuses it with 400", what, x.status)
	}
	return want
}

// separate sends rq, a request of its own though it shares x1's key in
// whole or in part, and fails o when it gets x1's answer; who names its
// sender, and seen what that shows. It returns the answer when it may be
// one of its own, or nil when there is none or it is x1's.
//
// An answer marked as a replay is x1's. An unmarked answer with x1's very
// bytes may be an execution of its own from an endpoint whose answer is
// the same every time ({"status":"accepted"}): with an Executions count
// the count decides (the caller expects an execution); without one it is
// taken for an execution when the endpoint marks its replays elsewhere,
// and otherwise nothing can be concluded from the answers.
func (c *checker) separate(ctx context.Context, o *outcome, x1 *exchange, rq request, who, seen string) *exchange {
	x := c.send(ctx, rq)
	o.show(x)
	switch {
	case x.err != nil:
		o.fail("%s got no answer: %v", who, x.err)
	case x.markedAny():
		o.fail("%s got the first request's answer, marked as a replay (%s): %s", who, x.marker(), seen)
	case !x.sameAnswer(x1) || c.cfg.Executions != nil:
		return x
	case c.marksReplays():
		o.note("", fmt.Sprintf("%s's answer has the first's bytes, unmarked; the endpoint marks its replays, so the kit infers an execution of its own", who))
		return x
	default:
		o.skip("%s got the first request's bytes, unmarked, and the endpoint marked no answer as a replay: from the answers alone the kit cannot tell an execution of its own from the first request's answer (-effects counts executions)", who)
	}
	return nil
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
	c.judgeReplay(ctx, o, before, x1, x2)
	c.expectExecutions(ctx, o, before, 1)
}

// judgeReplay judges x2, the retry of x1 once x1 was answered: the same
// status and bytes, marked as the profile marks a replay. A retry that
// differs is judged with the executions counted since before, if counted.
func (c *checker) judgeReplay(ctx context.Context, o *outcome, before int64, x1, x2 *exchange) {
	switch {
	case x2.err != nil:
		o.fail("the retry got no answer: %v", x2.err)
		return
	case x2.status != x1.status:
		o.fail("the retry was answered %d, the first request %d: the replay differs from the first answer", x2.status, x1.status)
		return
	case !x2.sameAnswer(x1):
		o.fail("the retry's body differs from the first answer's %s; %s", difference(x1.resp, x2.resp),
			inferred(c.since(ctx, o, before), "a second execution, or a replay not stored byte for byte"))
		return
	}
	c.judgeMarker(o, x2)
}

// judgeMarker notes a replay that does not carry the profile's marker.
func (c *checker) judgeMarker(o *outcome, x *exchange) {
	switch m := x.marker(); {
	case m == "":
		o.differ("a replay carries no marker; the profile marks it %s: true", o.profile.marker())
	case !slices.Contains(o.profile.markers(), m):
		o.differ("a replay is marked %s; the profile's marker is %s", m, o.profile.marker())
	}
}

func checkMismatch(ctx context.Context, c *checker, o *outcome) {
	before := c.executions(ctx, o)
	key := c.key("mismatch")
	x1 := c.first(ctx, o, key)
	if x1 == nil {
		return
	}
	x2 := c.send(ctx, request{what: "the same key, other body", keys: []string{key}, body: c.other})
	o.show(x2)
	want := int64(1)
	switch {
	case x2.err != nil:
		o.fail("the other body got no answer: %v", x2.err)
	case x2.markedAny() || x2.sameAnswer(x1):
		o.fail("the key reused with another body got the first body's answer")
	case x2.success() && c.cfg.Executions == nil:
		o.fail("the key reused with another body was answered %d with an answer of its own: the kit infers it was executed under the key", x2.status)
		want = 2
	case x2.success():
		// The count says whether it was executed.
		o.fail("the key reused with another body was answered %d with an answer of its own, not refused", x2.status)
		want = 2
	case !slices.Contains(o.profile.mismatch(), x2.status):
		o.differ("the key reused with another body was answered %d; the profile answers %s", x2.status, statuses(o.profile.mismatch()))
	default:
		o.checkProblem(x2, o.profile.ProblemTypes.KeyReused)
	}
	c.expectExecutions(ctx, o, before, want)
}

// inFlight sends the request and, while it is in flight, the same again
// (or the other request): one execution, and the answers the profile
// requires. Which of the two requests takes the key first is up to the
// network; each is judged by which one executed.
func inFlight(ctx context.Context, c *checker, o *outcome, other bool) {
	body2, what2 := c.cfg.Body, "the same again, while the first is in flight"
	if other {
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
	all := append([]*exchange{x1}, during...)
	if !slices.ContainsFunc(all, (*exchange).success) {
		o.fail("no request succeeded; the first was %s: the scenario needs it to succeed; %s", brief(x1), c.hint(x1))
		return
	}
	if len(overlapped) == 0 {
		o.skip("the first request was answered in %s, before a second could reach the endpoint: it is too fast to catch in flight from outside", x1.done.Sub(x1.sent).Round(time.Millisecond))
		return
	}
	if !other {
		c.judgeSameKey(ctx, o, before, append([]*exchange{x1}, overlapped...), false)
	} else {
		c.judgeOtherInFlight(ctx, o, before, x1, overlapped)
	}
	c.expectExecutions(ctx, o, before, 1)
}

// withWrote returns ctx with a trace that closes wrote once the request is
// written.
func withWrote(ctx context.Context, wrote chan struct{}) context.Context {
	var once sync.Once
	return httptraceWrote(ctx, func() { once.Do(func() { close(wrote) }) })
}

// marksReplays reports whether the endpoint marked any answer of the check
// so far as a replay.
func (c *checker) marksReplays() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.ContainsFunc(c.seen, (*exchange).markedAny)
}

// judgeSameKey judges the answers to requests that share a key and a body:
// every success identical, at most one not marked as a replay, the rest
// 409, 429 or 503. With cut, requests that got no answer are allowed (a
// restart cut them). Every finding is recorded, not only the first. With
// an Executions count (since before), the count says what the answers
// show; without one, the kit infers it and says so.
func (c *checker) judgeSameKey(ctx context.Context, o *outcome, before int64, xs []*exchange, cut bool) {
	var ref *exchange
	unmarked, differing, noAnswer := 0, 0, 0
	var diff string
	for _, x := range xs {
		switch {
		case x.success():
			if ref == nil {
				ref = x
			} else if !x.sameAnswer(ref) {
				differing++
				if diff == "" {
					diff = difference(ref.resp, x.resp)
				}
			}
			// The marker's spelling is judged on the retry that follows a
			// storm, not here: a request in flight may or may not have
			// been answered from the stored answer.
			if !x.markedAny() {
				unmarked++
			}
		case x.busy():
			if x.status == http.StatusConflict {
				o.checkProblem(x, o.profile.ProblemTypes.InProgress)
			}
		case x.err != nil:
			noAnswer++
		default:
			o.differ("a request for the key in flight was answered %d; the profile answers 409 with Retry-After, or the first answer", x.status)
		}
	}
	n := int64(-1)
	if differing > 0 || unmarked > 1 {
		n = c.since(ctx, o, before)
	}
	if differing > 0 {
		o.fail("%d successful answer(s) for one key differ from the first, %s; %s", differing, diff, inferred(n, "more than one execution"))
	}
	switch {
	case unmarked <= 1:
	case n >= int64(unmarked):
		// The count shows these answers were executions, each of its own:
		// that is the count's finding, not a missing marker.
	case n >= 0:
		o.differ("%d successful answers for one key carry no replay marker, and %d execution(s) counted: %d replay(s) unmarked; the profile marks replays %s: true",
			unmarked, n, int64(unmarked)-max(n, 1), o.profile.marker())
	case c.marksReplays():
		// An unmarked answer from an endpoint that marks its replays is
		// an execution.
		o.fail("%d successful answers for one key carry no replay marker, though the endpoint marks its replays: the kit infers %d executions", unmarked, unmarked)
	default:
		o.differ("%d successful answers for one key carry no replay marker; the profile marks replays %s: true (-effects counts executions exactly)", unmarked, o.profile.marker())
	}
	if noAnswer > 0 && !cut {
		o.fail("%d request(s) for the key got no answer", noAnswer)
	}
}

// judgeOtherInFlight judges two payloads sent under one key while the first
// was in flight: exactly one ran, and the other got the profile's answer.
func (c *checker) judgeOtherInFlight(ctx context.Context, o *outcome, before int64, x1 *exchange, others []*exchange) {
	ran := 0
	for _, x := range append([]*exchange{x1}, others...) {
		switch {
		case x.success() && (x == x1 || !x.markedAny()):
			ran++
		case x.success():
			o.fail("the other body got the first body's answer (%s)", x.marker())
		case x.err != nil:
			o.fail("a request got no answer: %v", x.err)
		case !o.profile.inFlightMismatch(x.status):
			o.differ("the payload that did not run was answered %d; the profile answers %s", x.status, statuses(o.profile.accepted()))
		}
	}
	if ran > 1 {
		o.fail("both payloads were answered with success under one key; %s", inferred(c.since(ctx, o, before), "both were executed"))
	}
}

func checkStorm(ctx context.Context, c *checker, o *outcome) {
	before := c.executions(ctx, o)
	key := c.key("storm")
	xs := c.sendTogether(ctx, c.cfg.Storm, request{keys: []string{key}, body: c.cfg.Body}, func(<-chan *exchange) {})
	c.judgeStorm(ctx, o, before, key, xs, fmt.Sprintf("%d× key %s, body, at once", c.cfg.Storm, key), false)
}

// judgeStorm retries a storm's key until it is answered, and judges the
// storm and that answer: one execution since before, the key's answer
// found, the answers judgeSameKey requires. sent describes the storm; with
// cut, requests of the storm may have got no answer.
func (c *checker) judgeStorm(ctx context.Context, o *outcome, before int64, key string, xs []*exchange, sent string, cut bool) {
	final := c.settle(ctx, key, "then a retry until answered", cut)
	o.note(sent, tally(xs))
	for i, x := range xs {
		x.what = fmt.Sprintf("request %d of the storm", i+1)
	}
	o.answer(xs...)
	o.show(final)
	if !final.success() {
		o.fail("the retry after the storm was %s, not with the key's answer", brief(final))
	} else if final.markedAny() {
		c.judgeMarker(o, final)
	}
	c.judgeSameKey(ctx, o, before, append(xs, final), cut)
	c.expectExecutions(ctx, o, before, 1)
}

// restartAttempts is how many storms the restart scenario sends before it
// says the restart was not exercised.
const restartAttempts = 5

// checkRestart restarts the server while an execution is in flight in a
// storm, and judges the storm and the key's answer afterwards. An
// execution is in flight when the Executions count rose and no request has
// been answered with success; without Executions, when a request was
// refused as in flight (409, 429 or 503) and none was answered with
// success. A storm whose restart could not land so is sent again under a
// new key. A restart must be seen to happen: a connection opened to the
// server before it is closed after it, or requests of the storm are cut;
// else it is not exercised. The scenario never passes without such a
// restart, nor without Executions, since from the answers alone an
// execution resumed after the restart and a second one look the same.
func checkRestart(ctx context.Context, c *checker, o *outcome) {
	if c.cfg.Restart == nil {
		o.skip("no restart command given (-restart); nothing restarts the server")
		return
	}
	var missed []string
	for attempt := 1; attempt <= restartAttempts && ctx.Err() == nil; attempt++ {
		landed, why := c.restartStorm(ctx, o)
		if o.failed() || o.has(Skip) {
			return
		}
		if landed {
			if c.cfg.Executions == nil {
				o.skip("the restart landed while a request held the key, but without an execution count (-effects) the check cannot tell an execution resumed after the restart from a second one")
			}
			return
		}
		missed = append(missed, why)
	}
	o.skip("not exercised: in %d storms no execution was in flight when the restart could run (%s)", len(missed), strings.Join(slices.Compact(missed), "; "))
}

// restartStorm sends a storm under a new key, restarts the server once an
// execution is in flight, then retries the key until it is answered, and
// judges it all. It reports whether the restart landed while an execution
// was in flight, and if not, why.
func (c *checker) restartStorm(ctx context.Context, o *outcome) (bool, string) {
	before := c.executions(ctx, o)
	if before < 0 && c.cfg.Executions != nil {
		return false, "the execution count could not be read"
	}
	key := c.key("restart")
	var landed, closed bool
	var missed, seen string
	var killed, restarted time.Time
	xs := c.sendTogether(ctx, c.cfg.Storm, request{keys: []string{key}, body: c.cfg.Body}, func(answered <-chan *exchange) {
		landed, missed, seen = c.awaitInFlight(ctx, answered, before)
		if !landed {
			return
		}
		probe := c.probe(ctx)
		killed = time.Now()
		if err := c.cfg.Restart(ctx); err != nil {
			o.fail("the restart failed: %v", err)
		}
		restarted = time.Now()
		closed = probe.closed()
	})
	if !landed {
		// The key was answered, or never held: settle it so that its
		// executions are over before the next storm counts its own.
		c.settle(ctx, key, "", true)
		return false, missed
	}
	cut := 0
	for _, x := range xs {
		if x.err != nil {
			cut++
		}
	}
	var went []string
	if closed {
		went = append(went, "a connection opened before it was closed")
	}
	if cut > 0 {
		went = append(went, fmt.Sprintf("it cut %d request(s) of the storm", cut))
	}
	sent := fmt.Sprintf("%d× key %s, body, at once; -restart ran %s after they were sent, %s, and returned %s later",
		c.cfg.Storm, key, killed.Sub(xs[0].sent).Round(time.Millisecond), seen, restarted.Sub(killed).Round(time.Millisecond))
	if len(went) > 0 {
		sent += "; the server went away: " + strings.Join(went, ", ")
	}
	c.judgeStorm(ctx, o, before, key, xs, sent, true)
	if len(went) == 0 && !o.failed() {
		o.skip("not exercised: the restart command returned, but nothing shows the server went away: a connection opened to it before the restart was still open after it, and every request of the storm was answered; the command must restart the server behind the URL and return once it serves again")
	}
	return true, ""
}

// probe is a connection opened to the endpoint's server just before a
// restart: a server that restarts closes it.
type probe struct{ conn net.Conn }

// probe opens a probe, or returns one that shows nothing when the server
// is reached through a proxy or cannot be reached.
func (c *checker) probe(ctx context.Context) probe {
	u, err := url.Parse(c.target)
	if err != nil {
		return probe{}
	}
	addr, ok := c.direct(u)
	if !ok {
		return probe{}
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return probe{}
	}
	return probe{conn: conn}
}

// closed reports whether the server closed the probe, and closes it.
func (p probe) closed() bool {
	if p.conn == nil {
		return false
	}
	defer p.conn.Close()
	_ = p.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err := p.conn.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// awaitInFlight watches a storm's answers, and its Executions count, until
// an execution is in flight: counted, or without a count shown by a request
// refused as in flight, while none was answered with success. It reports
// whether one was, and what showed it; or false, and why, when a success
// comes first or nothing shows within RequestTimeout.
func (c *checker) awaitInFlight(ctx context.Context, answered <-chan *exchange, before int64) (landed bool, missed, seen string) {
	deadline := time.NewTimer(c.cfg.RequestTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(2 * time.Millisecond)
	defer poll.Stop()
	held := 0
	for {
		select {
		case x := <-answered:
			switch {
			case x.success():
				return false, fmt.Sprintf("a request was answered %d before an execution was seen in flight", x.status), ""
			case x.busy():
				held = x.status
			}
		case <-poll.C:
		case <-deadline.C:
			return false, "no execution was seen in flight within the request timeout", ""
		case <-ctx.Done():
			return false, "the check was stopped", ""
		}
		if c.cfg.Executions == nil {
			if held != 0 {
				return true, "", fmt.Sprintf("once a request was answered %d (its key held) and none with success; no execution count shows one was in flight", held)
			}
			continue
		}
		if n, err := c.cfg.Executions(ctx); err == nil && n > before {
			// Counted, and not yet answered: an answer that arrived
			// meanwhile is read first, so that a finished execution is
			// not taken for one in flight.
			select {
			case x := <-answered:
				if x.success() {
					return false, fmt.Sprintf("a request was answered %d as its execution was counted", x.status), ""
				}
			default:
			}
			return true, "", "once an execution was counted and no request answered with success"
		}
	}
}

// tally summarises answers, every request counted: "1× 201, 18× 409, 1×
// no answer".
func tally(xs []*exchange) string {
	counts := map[string]int{}
	for _, x := range xs {
		k := strconv.Itoa(x.status)
		switch {
		case x.err != nil:
			k = "no answer"
		case x.marker() != "":
			k += " [" + x.marker() + "]"
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

// settleGrace is how long past the longest Retry-After it announced a key
// is given to be answered.
const settleGrace = 5 * time.Second

// settle sends Body under key until the answer is neither 409, 429 nor
// 503, nor, with down (a server that may be restarting), a failure to get
// one, waiting as Retry-After says (at most a second at a time), and
// returns the last answer. It gives up after SettleTimeout, or once the
// longest Retry-After the key answered has passed by settleGrace,
// whichever is later.
func (c *checker) settle(ctx context.Context, key, what string, down bool) *exchange {
	start := time.Now()
	deadline := start.Add(c.cfg.SettleTimeout)
	var longest time.Duration
	tries := 0
	for {
		x := c.send(ctx, request{what: what, keys: []string{key}, body: c.cfg.Body})
		tries++
		d, announced := retryAfter(x.header.Get("Retry-After"), time.Now())
		if x.busy() && announced && d > longest && d <= maxRetryAfter {
			// A client that honours Retry-After waits this long: so does
			// the check, as long as the endpoint keeps its word.
			longest = d
			deadline = later(deadline, x.done.Add(d+settleGrace))
		}
		retry := x.busy() || (down && x.err != nil && ctx.Err() == nil)
		if !retry || time.Now().After(deadline) {
			if tries > 1 && what != "" {
				x.what = fmt.Sprintf("%s (%d tries over %s)", what, tries, time.Since(start).Round(100*time.Millisecond))
			}
			return x
		}
		wait := 100 * time.Millisecond
		if announced && x.err == nil {
			wait = min(max(d, wait), time.Second)
		}
		select {
		case <-ctx.Done():
			return x
		case <-time.After(wait):
		}
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
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
		o.fail("the failing request was %s, not 5xx: the scenario needs a 5xx; check -d500", brief(x1))
		return
	}
	if x1.markedAny() {
		o.differ("the first %d under a new key is marked as a replay (%s)", x1.status, x1.marker())
	}
	x2 := c.send(ctx, request{what: "the same again", keys: []string{key}, body: c.cfg.FailBody})
	o.show(x2)
	switch {
	case x2.err != nil:
		o.fail("the retry got no answer: %v", x2.err)
	case x2.markedAny() && !x2.sameAnswer(x1):
		o.fail("the retry is marked as a replay but differs from the first %d %s", x1.status, difference(x1.resp, x2.resp))
	case x2.markedAny() && !o.profile.ReplaysServerErrors:
		o.differ("the %d was replayed as the key's final answer; the profile keeps no 5xx, so that a retry runs again", x1.status)
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
	if up.err != nil {
		o.note(x1.what, "the proxy could not reach the endpoint: "+up.err.Error())
	} else {
		o.note(x1.what, "dropped; the endpoint had answered "+up.got())
	}
	if x1.err == nil {
		o.fail("the proxy did not drop the answer")
		return
	}
	if !up.success() {
		o.fail("the request was %s, not 2xx: the scenario needs it to succeed; %s", brief(up), c.hint(up))
		return
	}
	x2 := c.settle(ctx, key, "the same again, directly", false)
	o.show(x2)
	c.judgeReplay(ctx, o, before, up, x2)
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
	x2 := c.separate(ctx, o, x1, request{what: "the same key and body from the second caller", keys: []string{key}, body: c.cfg.Body, caller: 2},
		"the second caller", "one caller's key answers another's")
	want := int64(1)
	switch {
	case x2 == nil:
	case x2.status >= 500:
		o.fail("the second caller's request was answered %d: the scenario needs it answered", x2.status)
	case x2.success():
		want = 2
	default:
		o.differ("the second caller's request under the first caller's key was refused (%d): keys are shared across callers, not scoped to each", x2.status)
	}
	if n := c.expectExecutions(ctx, o, before, want); n == 1 && x2 != nil && x2.sameAnswer(x1) {
		o.fail("the second caller got the first request's bytes, and the count shows no execution of its own: one caller's key answers another's")
	}
}

// maxRetryAfter is the longest Retry-After the check takes for sane.
const maxRetryAfter = time.Hour

func checkRetryAfter(ctx context.Context, c *checker, o *outcome) {
	c.mu.Lock()
	seen := slices.Clone(c.seen)
	c.mu.Unlock()
	checked, wrong := 0, 0
	for _, x := range seen {
		// A refusal of the other body is not one a client retries: the
		// key is taken by the first.
		if !x.busy() || bytes.Equal(x.body, c.other) {
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
		if wrong++; wrong <= 3 {
			o.show(x)
		}
	}
	if checked == 0 {
		o.skip("no 409, 429 or 503 was answered during the check")
		return
	}
	o.note(fmt.Sprintf("%d answers 409, 429 or 503 during the check", checked), fmt.Sprintf("%d with a sane Retry-After", checked-wrong))
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
