package pgtest

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TCPAddr returns a 127.0.0.1 address that forwards each connection to the
// shared server, which may listen on a unix socket only, for a test of what
// a client does over TCP: there pgx asks for TLS before it logs in, unless
// sslmode=disable. The listener closes when t finishes.
func TCPAddr(t testing.TB) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(Server(t).AdminDSN)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	network, target := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial(network, target)
			if err != nil {
				client.Close()
				continue
			}
			go func() { _, _ = io.Copy(server, client); server.Close() }()
			go func() { _, _ = io.Copy(client, server); client.Close() }()
		}
	}()
	return ln.Addr().String()
}
