package exampleprog

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase/phase"
)

// shutdownTimeout bounds how long a server waits for the requests in
// flight when it is shut down.
const shutdownTimeout = 5 * time.Second

// Listen serves h on addr in the background and returns its base URL
// (http://host:port, the port chosen when addr's is 0) and a func that
// shuts the server down gracefully.
func Listen(addr string, h http.Handler) (url string, shutdown func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	url, shutdown = serve(ln, h)
	return url, shutdown, nil
}

// Serve serves h on ln until ctx ends, and then shuts the server down
// gracefully. Once it serves it logs msg with the server's url and attrs,
// as slog.Info does. A program listens first, before it opens its database
// or starts anything in the background, so that an address already in use
// stops it at once with that error.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, msg string, attrs ...any) error {
	url, shutdown := serve(ln, h)
	slog.Info(msg, append([]any{"url", url}, attrs...)...)
	<-ctx.Done()
	shutdown()
	return nil
}

func serve(ln net.Listener, h http.Handler) (url string, shutdown func()) {
	url = "http://" + ln.Addr().String()
	if _, ok := h.(problemAPI); ok {
		ln = problemListener{ln}
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	return url, func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}

// Problems marks h as an API that answers its errors as problem+json
// (phase.WriteProblem), so that Listen and Serve answer in that format the
// errors that net/http's server writes itself, before any handler runs: 400
// for a request that is not HTTP/1.x, 431 for headers over
// http.DefaultMaxHeaderBytes, 501 for a transfer encoding it does not
// know, 505 for another HTTP version.
func Problems(h http.Handler) http.Handler { return problemAPI{h} }

type problemAPI struct{ http.Handler }

// problemListener's connections rewrite the server's own error answers.
type problemListener struct{ net.Listener }

func (l problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return problemConn{c}, nil
}

type problemConn struct{ net.Conn }

// Write passes every write through, except one that is an answer net/http
// writes for a request it could not read, which it replaces.
func (c problemConn) Write(b []byte) (int, error) {
	res := protocolProblem(b)
	if res == nil {
		return c.Conn.Write(b)
	}
	if _, err := c.Conn.Write(res); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite lets the server half-close the connection after a 431, as it
// does on a bare TCP connection, so that the client reads the answer before
// the connection goes.
func (c problemConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// serverErrorHeaders follow the status line of every answer that net/http's
// server writes straight to the connection when it cannot read a request
// (net/http.conn.serve), and of no answer to a request a handler served:
// those carry a Date header.
const serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// protocolProblem returns the problem+json answer that replaces b, when b is
// one of net/http's own error answers, and nil otherwise.
func protocolProblem(b []byte) []byte {
	rest, ok := bytes.CutPrefix(b, []byte("HTTP/1.1 "))
	if !ok {
		return nil
	}
	statusLine, _, ok := bytes.Cut(rest, []byte(serverErrorHeaders))
	if !ok || bytes.ContainsAny(statusLine, "\r\n") || len(statusLine) < 4 {
		return nil
	}
	status, err := strconv.Atoi(string(statusLine[:3]))
	if err != nil || status < 400 {
		return nil
	}
	detail := "the request could not be read as HTTP/1.x"
	switch _, text, _ := strings.Cut(string(statusLine), ": "); {
	case status == http.StatusRequestHeaderFieldsTooLarge:
		detail = "the request line and headers exceed the " + strconv.Itoa(http.DefaultMaxHeaderBytes>>20) + " MiB the server reads"
	case status == http.StatusNotImplemented:
		detail = "the request's Transfer-Encoding is not supported"
	case text != "":
		detail = text
	}
	var rec recorder
	rec.header = http.Header{}
	phase.WriteProblem(&rec, status, strings.ReplaceAll(strings.ToLower(http.StatusText(status)), " ", "-"),
		http.StatusText(status), detail, 0)
	res := &http.Response{
		StatusCode:    status,
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        rec.header,
		Body:          io.NopCloser(&rec.body),
		ContentLength: int64(rec.body.Len()),
		Close:         true,
	}
	var out bytes.Buffer
	_ = res.Write(&out) // writes to a bytes.Buffer cannot fail
	return out.Bytes()
}

// recorder is the http.ResponseWriter that phase.WriteProblem renders a
// problem into.
type recorder struct {
	header http.Header
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(int)             {}
