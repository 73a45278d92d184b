package exampleprogtest

import (
	"net"
	"strconv"
	"sync"
	"testing"
)

// TestFreeAddrNeverGivesAPortTwice: parallel tests each get a port of
// their own, below the ephemeral range, that a command can listen on.
func TestFreeAddrNeverGivesAPortTwice(t *testing.T) {
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
		wg   sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for range 25 {
				addr := FreeAddr(t)
				mu.Lock()
				if seen[addr] {
					t.Errorf("FreeAddr returned %s twice", addr)
				}
				seen[addr] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for addr := range seen {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		if p, _ := strconv.Atoi(port); p >= 32768 {
			t.Errorf("FreeAddr returned %s, in Linux's ephemeral range", addr)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("cannot listen on %s: %v", addr, err)
			continue
		}
		ln.Close()
	}
}
