// Package exampleprogtest is the test plumbing of the examples' commands:
// addresses for the servers a test starts.
package exampleprogtest

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

// ports holds the ports FreeAddr handed out in this test binary.
var ports struct {
	mu    sync.Mutex
	taken map[int]bool
}

// FreeAddr returns a loopback address that nothing listens on, for a
// command the test starts with -addr. No two calls in one test binary
// return the same port, so parallel tests never share one. Its port is
// below Linux's ephemeral range (32768 and up): no listener asking for any
// port and no outgoing connection is given it between FreeAddr's check and
// the command's listening, nor while a command is down between a kill and
// a restart.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	ports.mu.Lock()
	defer ports.mu.Unlock()
	if ports.taken == nil {
		ports.taken = map[int]bool{}
	}
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		if ports.taken[port] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ln.Close()
		ports.taken[port] = true
		return addr
	}
	tb.Fatal("exampleprogtest: no free port between 20000 and 32000")
	return ""
}
