package caller

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// KeyHeader is the request header that carries the idempotency key.
const KeyHeader = "Idempotency-Key"

// ReplayedHeader is the response header with which a server says, as Stripe
// and atomicphase do, that the answer is the key's stored response replayed.
const ReplayedHeader = "Idempotent-Replayed"

// ShouldRetryHeader is Stripe's response header that overrides the retry
// decision for the response that carries it: "true" retries it, "false"
// returns it.
const ShouldRetryHeader = "Stripe-Should-Retry"

// Defaults of Config.
const (
	DefaultMaxAttempts  = 8
	DefaultMaxElapsed   = 30 * time.Second
	DefaultBaseDelay    = 100 * time.Millisecond
	DefaultMaxDelay     = 5 * time.Second
	DefaultMaxBodyBytes = 1 << 20
)

// Config configures a Client. Zero values mean the default.
type Config struct {
	// Transport sends each attempt. Defaults to http.DefaultTransport.
	Transport http.RoundTripper
	// MaxAttempts is how many attempts one request may take, the first
	// included. Defaults to DefaultMaxAttempts; 1 disables retries.
	MaxAttempts int
	// MaxElapsed bounds one request, its attempts, the pauses between them
	// and the reading of the final response's body, under the request's
	// own context. Defaults to DefaultMaxElapsed; -1 leaves the request's
	// context as the only bound.
	MaxElapsed time.Duration
	// BaseDelay and MaxDelay shape the pause before a retry: a uniformly
	// random duration between zero and BaseDelay doubled for each earlier
	// retry, capped at MaxDelay ("full jitter"), or the response's
	// Retry-After when that is longer. Default to DefaultBaseDelay and
	// DefaultMaxDelay.
	BaseDelay, MaxDelay time.Duration
	// MaxBodyBytes is the largest request body the client buffers to
	// re-send when the request has no GetBody (http.NewRequest sets one
	// for bytes, strings and bytes.Buffer bodies). A larger body fails
	// before anything is sent. Defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// NewKey makes the key of a request that has none. Defaults to NewKey.
	NewKey func() (string, error)
	// Observe, when set, is called after every attempt, from the
	// goroutine that called Do or RoundTrip.
	Observe func(Attempt)
}

// Attempt is one attempt of a request, as Config.Observe sees it.
type Attempt struct {
	// Key is the request's idempotency key, as sent.
	Key string
	// Number counts the request's attempts from 1.
	Number int
	// Status is the response's status; 0 when the attempt got none.
	Status int
	// Replayed reports Idempotent-Replayed: true on the response.
	Replayed bool
	// Err is why the attempt got no response.
	Err error
	// Retry reports that another attempt follows, after Wait.
	Retry bool
	Wait  time.Duration
}

// Client sends requests to an endpoint that honours idempotency keys and
// retries them under one key until it has an answer the server will not
// change, or its budget runs out. It is an http.RoundTripper, safe for
// concurrent use. See the package documentation for every rule it follows.
type Client struct {
	cfg Config
}

// New returns a Client, or an error naming the first invalid field of cfg.
func New(cfg Config) (*Client, error) {
	switch {
	case cfg.MaxAttempts < 0:
		return nil, fmt.Errorf("caller: Config.MaxAttempts is %d; it must be positive (or zero for the default)", cfg.MaxAttempts)
	case cfg.MaxElapsed < -1:
		return nil, fmt.Errorf("caller: Config.MaxElapsed is %v; it must be positive, zero for the default, or -1", cfg.MaxElapsed)
	case cfg.BaseDelay < 0, cfg.MaxDelay < 0:
		return nil, errors.New("caller: Config.BaseDelay and MaxDelay must not be negative")
	case cfg.MaxBodyBytes < 0:
		return nil, errors.New("caller: Config.MaxBodyBytes must not be negative")
	}
	cfg.Transport = cmp.Or[http.RoundTripper](cfg.Transport, http.DefaultTransport)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.MaxElapsed = cmp.Or(cfg.MaxElapsed, DefaultMaxElapsed)
	cfg.BaseDelay = cmp.Or(cfg.BaseDelay, DefaultBaseDelay)
	cfg.MaxDelay = cmp.Or(cfg.MaxDelay, DefaultMaxDelay)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	if cfg.NewKey == nil {
		cfg.NewKey = NewKey
	}
	return &Client{cfg: cfg}, nil
}

// NewKey returns a new UUIDv7 as a key: 74 random bits after a millisecond
// timestamp, so keys made apart never collide and sort by creation time.
func NewKey() (string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("caller: making a key: %w", err)
	}
	return id.String(), nil
}

// Response is the answer to a request, with how it was obtained.
type Response struct {
	*http.Response
	// Key is the request's idempotency key, as sent; empty for a safe
	// method, which is sent without one.
	Key string
	// Attempts is how many attempts the answer took.
	Attempts int
	// Replayed reports that the server answered with the key's stored
	// response (Idempotent-Replayed: true): an earlier attempt, or an
	// earlier request with the same key, did the work.
	Replayed bool
}

// ErrBudgetExhausted is the cause in an UnknownOutcomeError when the
// request used up Config.MaxAttempts or Config.MaxElapsed.
var ErrBudgetExhausted = errors.New("caller: retry budget exhausted")

// UnknownOutcomeError says that a request ended without an answer the
// server will not change: the work may have been done, or not, or may
// still be running. Sending the same request again with Key in the
// Idempotency-Key header, later, gets the answer without doing the work
// twice.
type UnknownOutcomeError struct {
	// Key is the request's idempotency key, as sent.
	Key string
	// Attempts is how many attempts were sent.
	Attempts int
	// Status is the last attempt's status; 0 when it got no response.
	Status int
	// Cause is why retrying stopped: ErrBudgetExhausted, or the error of
	// the request's context.
	Cause error
	// Last is the last attempt's error when it got no response.
	Last error
}

func (e *UnknownOutcomeError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "caller: outcome unknown after %d attempts (%v", e.Attempts, e.Cause)
	switch {
	case e.Last != nil:
		fmt.Fprintf(&b, "; last attempt: %v", e.Last)
	case e.Status != 0:
		fmt.Fprintf(&b, "; last attempt: %d %s", e.Status, http.StatusText(e.Status))
	}
	fmt.Fprintf(&b, "); retry later with %s %s", KeyHeader, e.Key)
	return b.String()
}

// Unwrap returns Cause and Last, so errors.Is finds ErrBudgetExhausted or
// context.Canceled.
func (e *UnknownOutcomeError) Unwrap() []error {
	return []error{e.Cause, e.Last}
}

// RoundTrip implements http.RoundTripper with Do, so an http.Client built on
// the Client retries as Do does (and follows redirects); use Do to learn
// the key, the attempts and whether the answer was replayed.
func (c *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	return res.Response, nil
}

// Do sends req and returns its answer. A safe method (GET, HEAD, OPTIONS,
// TRACE) is sent once, as it is. Any other request is sent under an
// Idempotency-Key, its own when it has one and otherwise a new one, and is
// retried under that key, with its body re-sent, until an answer the
// server will not change; when the budget or req's context ends first, Do
// returns an *UnknownOutcomeError naming the key.
//
// The returned body must be closed; with Config.MaxElapsed set, reading it
// must end within that time too. Do never follows redirects.
func (c *Client) Do(req *http.Request) (*Response, error) {
	if safe(req.Method) {
		resp, err := c.cfg.Transport.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		return &Response{Response: resp, Attempts: 1}, nil
	}
	key := req.Header.Get(KeyHeader)
	if key == "" {
		var err error
		if key, err = c.cfg.NewKey(); err != nil {
			closeBody(req)
			return nil, err
		}
	}
	getBody, err := c.rewindable(req)
	if err != nil {
		return nil, err
	}
	if err := req.Context().Err(); err != nil {
		// Nothing was sent: the plain error proves it.
		return nil, fmt.Errorf("caller: the request's context ended before it was sent: %w", err)
	}
	ctx, cancel := req.Context(), context.CancelFunc(func() {})
	if c.cfg.MaxElapsed > 0 {
		ctx, cancel = context.WithTimeoutCause(ctx, c.cfg.MaxElapsed, ErrBudgetExhausted)
	}
	res, err := c.send(ctx, req, key, getBody)
	if err != nil {
		cancel()
		return nil, err
	}
	res.Body = &cancelBody{ReadCloser: res.Body, cancel: cancel, key: key, attempts: res.Attempts, status: res.StatusCode}
	return res, nil
}

// send runs the attempts under ctx, whose end ends the request.
func (c *Client) send(ctx context.Context, req *http.Request, key string, getBody func() (io.ReadCloser, error)) (*Response, error) {
	unknown := &UnknownOutcomeError{Key: key}
	var status *url.URL // set once the server accepted the request (202)
	polls := 0
	for n := 1; ; n++ {
		attempt := req.Clone(ctx)
		attempt.Header.Set(KeyHeader, key)
		attempt.GetBody = getBody
		if status != nil {
			attempt.Method, attempt.URL, attempt.Host = http.MethodGet, status, ""
			attempt.Body, attempt.GetBody, attempt.ContentLength = nil, nil, 0
			attempt.Header.Del("Content-Type")
		} else if getBody != nil {
			body, err := getBody()
			if err != nil {
				return nil, fmt.Errorf("caller: re-reading the request body for attempt %d: %w", n, err)
			}
			attempt.Body = body
		}
		resp, err := c.cfg.Transport.RoundTrip(attempt)
		unknown.Attempts, unknown.Status, unknown.Last = n, 0, err
		a := Attempt{Key: key, Number: n, Err: err}
		var retry bool
		var wait time.Duration // the least pause the server asked for
		if err == nil {
			unknown.Status = resp.StatusCode
			a.Status, a.Replayed = resp.StatusCode, replayed(resp)
			retry = retryable(resp)
			if loc := accepted(resp, attempt.URL); loc != nil {
				// The request goes on in the background: poll its status.
				status, retry = loc, true
			} else if status != nil && resp.StatusCode == http.StatusAccepted {
				retry = true // still running
			}
			if retry {
				// Whatever made the answer worth another attempt (its
				// status, a 202 to poll, Stripe-Should-Retry), its
				// Retry-After is the least pause before the next.
				wait = retryAfter(resp.Header.Get("Retry-After"), time.Now())
			}
		} else {
			retry = ctx.Err() == nil && !permanent(err)
		}
		if !retry && err == nil {
			c.observe(a)
			return &Response{Response: resp, Key: key, Attempts: n, Replayed: a.Replayed}, nil
		}
		if !retry {
			c.observe(a)
			switch {
			case ctx.Err() != nil:
				unknown.Cause = context.Cause(ctx)
			case n > 1:
				// An earlier attempt may have done the work.
				unknown.Cause = err
			default:
				return nil, err
			}
			return nil, unknown
		}
		// Polls of a status location, and answers that the key is in
		// flight with a Retry-After, wait as retries do, but only the
		// request's other attempts count toward MaxAttempts: a live server
		// that says when to come back is no reason to give up.
		retries := n
		if status != nil || err == nil && resp.StatusCode == http.StatusConflict && wait > 0 {
			polls++
			retries = polls
		}
		a.Wait = max(c.backoff(retries), wait)
		deadline, hasDeadline := ctx.Deadline()
		a.Retry = n-polls < c.cfg.MaxAttempts && (!hasDeadline || time.Now().Add(a.Wait).Before(deadline))
		if !a.Retry {
			a.Wait = 0
		}
		c.observe(a)
		if resp != nil {
			drain(resp)
		}
		if !a.Retry {
			unknown.Cause = ErrBudgetExhausted
			if d, ok := req.Context().Deadline(); ok && n-polls < c.cfg.MaxAttempts && d.Equal(deadline) {
				// The caller's own deadline, not the budget, comes first.
				unknown.Cause = context.DeadlineExceeded
			}
			return nil, unknown
		}
		if err := sleep(ctx, a.Wait); err != nil {
			unknown.Cause = err
			return nil, unknown
		}
	}
}

func (c *Client) observe(a Attempt) {
	if c.cfg.Observe != nil {
		c.cfg.Observe(a)
	}
}

// backoff is the full-jitter pause before the retry that follows attempt n.
func (c *Client) backoff(n int) time.Duration {
	n = max(n, 1)
	ceiling := c.cfg.MaxDelay
	if shift := n - 1; shift < 32 && c.cfg.BaseDelay<<shift < ceiling && c.cfg.BaseDelay<<shift > 0 {
		ceiling = c.cfg.BaseDelay << shift
	}
	return rand.N(ceiling + 1)
}

// rewindable returns the function that gives each attempt its body: req's
// GetBody, or a reader of req's body buffered up to MaxBodyBytes. req's own
// body is closed, as a RoundTripper must.
func (c *Client) rewindable(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		closeBody(req)
		return req.GetBody, nil
	}
	defer closeBody(req)
	buf, err := io.ReadAll(io.LimitReader(req.Body, c.cfg.MaxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("caller: reading the request body: %w", err)
	}
	if int64(len(buf)) > c.cfg.MaxBodyBytes {
		return nil, fmt.Errorf("caller: the request body is larger than %d bytes and has no GetBody to re-send it; "+
			"raise Config.MaxBodyBytes or set the request's GetBody", c.cfg.MaxBodyBytes)
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }, nil
}

// safe reports the methods RFC 9110 defines as safe: they change nothing,
// so they need no key.
func safe(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// retryable reports whether resp is worth another attempt under the same
// key.
func retryable(resp *http.Response) bool {
	switch strings.ToLower(resp.Header.Get(ShouldRetryHeader)) {
	case "true":
		return true
	case "false":
		return false
	}
	if replayed(resp) {
		// The key's stored answer: every retry gets it again.
		return false
	}
	switch resp.StatusCode {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// accepted returns the status location of a 202 Accepted answer, resolved
// against the attempt's URL; nil for any other answer, or a 202 without a
// usable Location.
func accepted(resp *http.Response, base *url.URL) *url.URL {
	if resp.StatusCode != http.StatusAccepted {
		return nil
	}
	loc := resp.Header.Get("Location")
	if loc == "" {
		return nil
	}
	u, err := base.Parse(loc)
	if err != nil {
		return nil
	}
	return u
}

// retryAfter parses a Retry-After value, delay-seconds or an HTTP-date
// (RFC 9110, section 10.2.3); 0 when absent, invalid or past.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

func replayed(resp *http.Response) bool {
	return strings.EqualFold(resp.Header.Get(ReplayedHeader), "true")
}

// permanent reports transport errors that no retry can cure.
func permanent(err error) bool {
	var cert *tls.CertificateVerificationError
	return errors.As(err, &cert)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// drain reads a little of a response that is being retried, so that its
// connection can be reused, and closes it.
func drain(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
	_ = resp.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// cancelBody ends the request's budget once its body is read or closed.
// A body cut short is an unknown outcome: the answer exists, but only a
// retry under the key can read it whole.
type cancelBody struct {
	io.ReadCloser
	cancel   context.CancelFunc
	key      string
	attempts int
	status   int
}

func (b *cancelBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		b.cancel()
	case err != nil:
		err = &UnknownOutcomeError{Key: b.key, Attempts: b.attempts, Status: b.status, Cause: err, Last: err}
	}
	return n, err
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
