package conformance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/atomicphase/atomicphase/keyrow"
)

// maxResponseBytes bounds how much of an answer the check reads.
const maxResponseBytes = 4 << 20

// replayHeaders are the replay markers in use, whichever the profile
// expects: a 5xx marked with any of them was kept as final.
var replayHeaders = []string{"Idempotent-Replayed", "Idempotency-Replayed"}

// exchange is one request the check sent and what came back.
type exchange struct {
	what   string   // how the request is shown: "key K, body"
	keys   []string // the Idempotency-Key lines sent; nil for none
	body   []byte
	caller int // 1 or 2

	status int
	header http.Header
	resp   []byte
	err    error
	// timedOut reports that RequestTimeout ran out before the answer.
	timedOut bool
	// sent is when the request was written; done when the answer's
	// headers arrived (or the request failed).
	sent, done time.Time
}

// success reports a 2xx answer.
func (x *exchange) success() bool { return x.err == nil && x.status >= 200 && x.status < 300 }

// busy reports an answer that asks to retry later.
func (x *exchange) busy() bool {
	return x.err == nil && (x.status == http.StatusConflict || x.status == http.StatusTooManyRequests || x.status == http.StatusServiceUnavailable)
}

// sameAnswer reports whether x and y have the same status and bytes.
func (x *exchange) sameAnswer(y *exchange) bool {
	return x.err == nil && y.err == nil && x.status == y.status && bytes.Equal(x.resp, y.resp)
}

// markedBy reports whether x carries the replay header name with "true".
func (x *exchange) markedBy(name string) bool {
	return x.err == nil && strings.EqualFold(strings.TrimSpace(x.header.Get(name)), "true")
}

// markedAny reports whether x is marked as a replay by any known marker.
func (x *exchange) markedAny() bool {
	return slices.ContainsFunc(replayHeaders, x.markedBy)
}

// marker returns the replay marker x carries, or "".
func (x *exchange) marker() string {
	for _, name := range replayHeaders {
		if x.markedBy(name) {
			return name
		}
	}
	return ""
}

// got describes the answer: its status, its whole body, its Retry-After
// and the replay marker it carries, whichever spelling.
func (x *exchange) got() string {
	if x.err != nil {
		return "no answer: " + x.err.Error()
	}
	s := strconv.Itoa(x.status)
	if len(x.resp) > 0 {
		s += " " + shown(x.resp)
	}
	if ra := x.header.Get("Retry-After"); ra != "" {
		s += " (Retry-After " + ra + ")"
	}
	if m := x.marker(); m != "" {
		s += " [" + m + "]"
	}
	return s
}

// shown returns b as text, or its length when it is not UTF-8.
func shown(b []byte) string {
	if !utf8.Valid(b) {
		return fmt.Sprintf("<%d bytes>", len(b))
	}
	return string(b)
}

// difference shows where a and b first differ: the byte offset and a few
// bytes of each around it, so that two answers that start alike are told
// apart.
func difference(a, b []byte) string {
	at := len(a)
	if len(b) < at {
		at = len(b)
	}
	for i := range at {
		if a[i] != b[i] {
			at = i
			break
		}
	}
	around := func(s []byte) string {
		from, to := max(at-16, 0), min(at+16, len(s))
		out := shown(s[from:to])
		if from > 0 {
			out = "…" + out
		}
		if to < len(s) {
			out += "…"
		}
		return strconv.Quote(out)
	}
	return fmt.Sprintf("at byte %d: %s and %s", at, around(a), around(b))
}

// checker sends the scenarios' requests to one endpoint.
type checker struct {
	cfg       Config
	target    string // the endpoint's absolute URL
	client    *http.Client
	prefix    string // starts every key of this check
	seq       atomic.Int64
	other     []byte // cfg.OtherBody, or the one made from Body
	otherNote string // how other was made, or why there is none

	mu   sync.Mutex
	seen []*exchange // every answer, for the Retry-After scenario

	controlOnce sync.Once
	control     *exchange // Body under a valid key; see controlRequest
}

func newChecker(cfg Config, target string) *checker {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = cfg.Storm
	var b [6]byte
	_, _ = rand.Read(b[:])
	c := &checker{cfg: cfg, target: target, client: &http.Client{Transport: t, CheckRedirect: noRedirects},
		prefix: "atomicphase-check-" + hex.EncodeToString(b[:])}
	c.other, c.otherNote = cfg.OtherBody, "given"
	if c.other == nil {
		c.other, c.otherNote = OtherBody(cfg.Body, cfg.Header.Get("Content-Type"))
	}
	return c
}

// noRedirects hands a redirect back to the scenario as the answer: a
// redirect is not what an idempotent POST should answer, and following it
// would send the request elsewhere.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// key returns a key no earlier request of any check used.
func (c *checker) key(scenario string) string {
	return fmt.Sprintf("%s-%s-%d", c.prefix, scenario, c.seq.Add(1))
}

// request is what a scenario sends.
type request struct {
	what   string
	keys   []string // nil: no Idempotency-Key
	body   []byte
	caller int          // 2 sends OtherCaller's headers
	via    string       // a proxy's base URL to send through instead
	client *http.Client // defaults to the checker's
}

// send sends rq and returns what came back; a failure to send is the
// exchange's err, never a panic or a hang past RequestTimeout.
func (c *checker) send(ctx context.Context, rq request) *exchange {
	x := c.exchange(rq)
	defer c.record(x)
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { x.sent = time.Now() },
	})
	req, err := c.newRequest(ctx, rq)
	if err != nil {
		x.err = err
		return x
	}
	client := c.client
	if rq.client != nil {
		client = rq.client
	}
	res, err := client.Do(req)
	x.done = time.Now()
	if err != nil {
		x.err = err
		x.timedOut = errors.Is(ctx.Err(), context.DeadlineExceeded) && parent.Err() == nil
		return x
	}
	defer res.Body.Close()
	x.status, x.header = res.StatusCode, res.Header
	x.resp, x.err = io.ReadAll(io.LimitReader(res.Body, maxResponseBytes))
	x.timedOut = x.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && parent.Err() == nil
	return x
}

// exchange returns the exchange that sending rq starts.
func (c *checker) exchange(rq request) *exchange {
	return &exchange{what: rq.what, keys: rq.keys, body: rq.body, caller: max(rq.caller, 1)}
}

// record completes x's times and keeps it for the Retry-After scenario.
func (c *checker) record(x *exchange) {
	if x.done.IsZero() {
		x.done = time.Now()
	}
	if x.sent.IsZero() {
		x.sent = x.done
	}
	c.mu.Lock()
	c.seen = append(c.seen, x)
	c.mu.Unlock()
}

// newRequest returns rq as an HTTP request to the endpoint, with the
// check's headers, the caller's, and rq's keys.
func (c *checker) newRequest(ctx context.Context, rq request) (*http.Request, error) {
	target := c.target
	if rq.via != "" {
		target = rq.via
	}
	req, err := http.NewRequestWithContext(ctx, c.cfg.Method, target, bytes.NewReader(rq.body))
	if err != nil {
		return nil, err
	}
	for k, v := range c.cfg.Header {
		req.Header[k] = slices.Clone(v)
	}
	if rq.caller == 2 {
		for k, v := range c.cfg.OtherCaller {
			req.Header[k] = slices.Clone(v)
		}
	}
	if h := req.Header.Get("Host"); h != "" {
		req.Host = h
	}
	req.Header.Del(keyrow.HeaderName)
	if rq.keys != nil {
		req.Header[keyrow.HeaderName] = rq.keys
	}
	return req, nil
}

// sendTogether sends n copies of rq so that they reach the endpoint at
// one moment, calls during once they are out, with each answer sent on
// answered as it arrives, and returns what came back to each once during
// has returned. Every copy has a connection of its own, opened beforehand, and
// is written whole but for its last byte; then the last bytes go out one
// after another in a tight loop. No server can read a copy's body before
// every copy has arrived, so a check-then-insert race a few milliseconds
// wide is caught even on a busy machine, where copies sent by goroutines
// of their own arrive tens of milliseconds apart. When the connections
// cannot be opened ahead (the endpoint is reached through a proxy, or a
// dial fails), the copies are sent at once through the client instead.
func (c *checker) sendTogether(ctx context.Context, n int, rq request, during func(answered <-chan *exchange)) []*exchange {
	xs := make([]*exchange, n)
	answered := make(chan *exchange, n)
	req, err := c.newRequest(ctx, rq)
	var conns []net.Conn
	if err == nil {
		conns = c.dialAhead(ctx, req.URL, n)
	}
	if conns == nil {
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := range xs {
			wg.Go(func() {
				<-gate
				xs[i] = c.send(ctx, rq)
				answered <- xs[i]
			})
		}
		close(gate)
		during(answered)
		wg.Wait()
		return xs
	}
	if u := req.URL.User; u != nil && req.Header.Get("Authorization") == "" {
		// As the client does for a URL with credentials.
		password, _ := u.Password()
		req.SetBasicAuth(u.Username(), password)
	}
	var wire bytes.Buffer
	if err := req.Write(&wire); err != nil {
		for i := range xs {
			xs[i] = c.exchange(rq)
			xs[i].err = err
			c.record(xs[i])
		}
		return xs
	}
	head, last := wire.Bytes()[:wire.Len()-1], wire.Bytes()[wire.Len()-1:]
	deadline := time.Now().Add(c.cfg.RequestTimeout)
	var wg sync.WaitGroup
	for i, conn := range conns {
		xs[i] = c.exchange(rq)
		_ = conn.SetDeadline(deadline)
		wg.Go(func() { _, xs[i].err = conn.Write(head) })
	}
	wg.Wait()
	for i, conn := range conns {
		if xs[i].err == nil {
			_, xs[i].err = conn.Write(last)
			xs[i].sent = time.Now()
		}
	}
	for i, conn := range conns {
		wg.Go(func() {
			defer func() { answered <- xs[i] }()
			defer conn.Close()
			defer c.record(xs[i])
			if xs[i].err != nil {
				return
			}
			xs[i].status, xs[i].header, xs[i].resp, xs[i].err = readAnswer(conn, req)
			xs[i].done = time.Now()
			xs[i].timedOut = errors.Is(xs[i].err, os.ErrDeadlineExceeded)
		})
	}
	during(answered)
	wg.Wait()
	return xs
}

// dialAhead opens n connections to u's host, with TLS for https, or
// returns nil when the client would reach u through a proxy or any of
// them cannot be opened.
func (c *checker) dialAhead(ctx context.Context, u *url.URL, n int) []net.Conn {
	addr, ok := c.direct(u)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			if u.Scheme == "https" {
				d := tls.Dialer{Config: &tls.Config{ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}}}
				conns[i], errs[i] = d.DialContext(ctx, "tcp", addr)
			} else {
				var d net.Dialer
				conns[i], errs[i] = d.DialContext(ctx, "tcp", addr)
			}
		})
	}
	wg.Wait()
	if errors.Join(errs...) != nil {
		for _, conn := range conns {
			if conn != nil {
				_ = conn.Close()
			}
		}
		return nil
	}
	return conns
}

// direct returns the address of u's server, or false when the client
// would reach u through a proxy.
func (c *checker) direct(u *url.URL) (string, bool) {
	if proxyFor := c.client.Transport.(*http.Transport).Proxy; proxyFor != nil {
		if proxy, err := proxyFor(&http.Request{URL: u}); proxy != nil || err != nil {
			return "", false
		}
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return net.JoinHostPort(u.Hostname(), port), true
}

// readAnswer reads the answer to req from conn, its body cut at
// maxResponseBytes.
func readAnswer(conn net.Conn, req *http.Request) (int, http.Header, []byte, error) {
	res, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxResponseBytes))
	return res.StatusCode, res.Header, body, err
}

// cutter is a proxy in front of the endpoint that forwards one request,
// reads the endpoint's whole answer, and closes the client's connection
// without sending a byte of it: a network failure after the request was
// executed.
type cutter struct {
	c   *checker
	srv *http.Server
	url string

	mu      sync.Mutex
	answers []*exchange // what the endpoint answered, in order
}

func (c *checker) startCutter() (*cutter, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("conformance: start the dropping proxy: %w", err)
	}
	p := &cutter{c: c, url: "http://" + ln.Addr().String()}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: c.cfg.RequestTimeout}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *cutter) close() { _ = p.srv.Close() }

func (p *cutter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	x := &exchange{err: err}
	if err == nil {
		// Forwarded as the client sent it, to the endpoint's URL.
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, p.c.target, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		if h := p.c.cfg.Header.Get("Host"); h != "" {
			req.Host = h
		}
		var res *http.Response
		if res, x.err = p.c.client.Do(req); x.err == nil {
			x.status, x.header = res.StatusCode, res.Header
			x.resp, x.err = io.ReadAll(io.LimitReader(res.Body, maxResponseBytes))
			res.Body.Close()
		}
	}
	p.mu.Lock()
	p.answers = append(p.answers, x)
	p.mu.Unlock()
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
		return
	}
	panic(http.ErrAbortHandler)
}

// forwarded returns what the endpoint answered the requests p forwarded.
func (p *cutter) forwarded() []*exchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.answers)
}

// oneShot returns a client on a connection of its own that is never
// reused, so that a dropped answer is not sent again by the transport
// (Go's client re-sends a request with an Idempotency-Key when a reused
// connection fails before any byte of the answer).
func oneShot() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DisableKeepAlives = true
	t.Proxy = nil
	return &http.Client{Transport: t, CheckRedirect: noRedirects}
}

// httptraceWrote returns ctx with a trace that calls wrote once the
// request is written, after any trace ctx already has.
func httptraceWrote(ctx context.Context, wrote func()) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote() },
	})
}
