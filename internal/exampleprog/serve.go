package exampleprog

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"
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
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// Serve serves h on addr until ctx ends, and then shuts the server down
// gracefully. Once it listens it logs msg with the server's url and attrs,
// as slog.Info does.
func Serve(ctx context.Context, addr string, h http.Handler, msg string, attrs ...any) error {
	url, shutdown, err := Listen(addr, h)
	if err != nil {
		return err
	}
	slog.Info(msg, append([]any{"url", url}, attrs...)...)
	<-ctx.Done()
	shutdown()
	return nil
}
