// Package lockttl is the lease on an idempotency key: how long a run may hold
// a key before another run may take it over, how a long-running holder keeps
// it, and what a waiting client is told.
//
// # Leases
//
// A run holds a key while the row's lock_expires_at lies in the future by the
// database clock. Acquire and every phase commit set it to now() + TTL, so a
// run that commits phases regularly never loses its key; a run that crashes
// loses it TTL after its last commit, and the next request or the completer
// takes the key over and resumes it.
//
// # Fencing
//
// Each lease carries a random token. Every write by the holder names the
// token, so a holder that stalled past its TTL and was taken over writes
// nothing; it learns of the loss through ErrLeaseLost (from keyrow) or
// through Lease.Lost while it keeps the lease alive with Keep.
package lockttl

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/atomicphase/atomicphase/keyrow"
)

// DefaultTTL is the lease length used when none is configured. It matches the
// reference implementation's 90 seconds: long enough for a slow payment
// provider, short enough that a crashed request is resumed quickly.
const DefaultTTL = 90 * time.Second

// DefaultRenewFraction is the share of the TTL after which Keep renews.
const DefaultRenewFraction = 3

// MaxRetryAfter caps RetryAfter. Every phase commit renews a lease to a full
// TTL, so the time left on a live lease says little about when its request
// will finish (usually far sooner); a client that retries early only gets
// another cheap 409.
const MaxRetryAfter = 5 * time.Second

// RetryAfter returns the whole seconds a client should wait before retrying
// a key whose lease has left to run: the time left, rounded up, at least one
// second (so a client honouring it does not spin) and at most MaxRetryAfter.
func RetryAfter(left time.Duration) int {
	s := int(math.Ceil(min(left, MaxRetryAfter).Seconds()))
	if s < 1 {
		return 1
	}
	return s
}

// Lease is a held lease on one key row.
type Lease struct {
	ID    uuid.UUID
	Token uuid.UUID
	TTL   time.Duration

	mu      sync.Mutex
	lost    chan struct{}
	lostErr error
}

// New returns the lease identified by a row id and its fencing token.
func New(id, token uuid.UUID, ttl time.Duration) *Lease {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return &Lease{ID: id, Token: token, TTL: ttl, lost: make(chan struct{})}
}

// Renew extends the lease to TTL from now by the database clock. When the
// key was taken over it returns keyrow.ErrLeaseLost and marks the lease lost.
func (l *Lease) Renew(ctx context.Context, q keyrow.Querier) error {
	_, err := keyrow.Renew(ctx, q, l.ID, l.Token, l.TTL)
	if errors.Is(err, keyrow.ErrLeaseLost) {
		l.markLost(err)
	}
	return err
}

// Lost is closed once the holder has learnt that the lease is gone.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err returns keyrow.ErrLeaseLost once the lease is known lost, else nil.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

// MarkLost records that a fenced write found the lease gone.
func (l *Lease) MarkLost() { l.markLost(keyrow.ErrLeaseLost) }

func (l *Lease) markLost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr == nil {
		l.lostErr = err
		close(l.lost)
	}
}

// Keep renews the lease every TTL/DefaultRenewFraction until the returned
// stop function is called, for work that may outlast the TTL, such as a slow
// foreign call. The returned context is cancelled when the lease is lost, so
// the work can stop before it commits anything. Renewal errors other than a
// lost lease (a store hiccup) are retried at the next tick; the lease is
// still bounded by its TTL.
func (l *Lease) Keep(ctx context.Context, q keyrow.Querier) (context.Context, func()) {
	workCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(l.TTL / DefaultRenewFraction)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-workCtx.Done():
				return
			case <-t.C:
				// The renewal must not be cut short by the work's own
				// cancellation, only by stop.
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.TTL/DefaultRenewFraction)
				err := l.Renew(rctx, q)
				rcancel()
				if errors.Is(err, keyrow.ErrLeaseLost) {
					cancel()
					return
				}
			}
		}
	}()
	return workCtx, func() {
		close(done)
		wg.Wait()
		cancel()
	}
}
