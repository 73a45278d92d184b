package store

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
)

// Lease is a held lease on one key row.
type Lease struct {
	ID    uuid.UUID
	Token uuid.UUID
	TTL   time.Duration

	// id and token as statement arguments, made once for every write.
	idArg, tokenArg any

	mu      sync.Mutex
	lost    chan struct{}
	lostErr error
}

// NewLease returns the lease identified by a row id and its fencing token.
// A TTL below lockttl.MinTTL is raised to it.
func NewLease(id, token uuid.UUID, ttl time.Duration) *Lease {
	return &Lease{ID: id, Token: token, TTL: max(ttl, lockttl.MinTTL), lost: make(chan struct{}),
		idArg: [16]byte(id), tokenArg: [16]byte(token)}
}

// Advance is AdvanceWrite for this lease: it commits point and state and
// renews the lease for its TTL.
func (l *Lease) Advance(point string, state []byte) (Write, error) {
	return advanceWrite(l.idArg, l.tokenArg, point, state, l.TTL)
}

// Finish is FinishWrite for this lease.
func (l *Lease) Finish(state []byte, resp keyrow.Response) (Write, error) {
	return finishWrite(l.idArg, l.tokenArg, state, resp)
}

// Renew extends the lease to TTL from now by the database clock. When the
// key was taken over it returns keyrow.ErrLeaseLost and marks the lease lost.
func (l *Lease) Renew(ctx context.Context, q Querier) error {
	_, err := Renew(ctx, q, l.ID, l.Token, l.TTL)
	if errors.Is(err, keyrow.ErrLeaseLost) {
		l.MarkLost()
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
func (l *Lease) MarkLost() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr == nil {
		l.lostErr = keyrow.ErrLeaseLost
		close(l.lost)
	}
}

// Keep renews the lease at once, by the database clock, and then every
// lockttl.RenewInterval(TTL) until stop is called, for work that may outlast
// the TTL, such as a foreign call.
//
// The first renewal is the holder's proof, immediately before the work
// starts, that the key is still its own: a holder that stalled past its TTL
// and was taken over gets keyrow.ErrLeaseLost here and must not start the
// work. Any other error of that renewal is returned too: the holder cannot
// tell whether it still holds the key.
//
// The returned context is cancelled when the lease is found lost, when
// limit (if positive) has passed, or when stop is called; the renewals end
// with it, so work that outlives its limit no longer keeps the key, which
// then expires and resumes elsewhere. The first renewal is bounded by ctx
// alone. Later renewal errors other than a lost lease (a store
// hiccup) are retried at the next tick; the lease is still bounded by its
// TTL. stop waits for the renewing goroutine to end, so a caller that defers
// it leaves nothing running, even when the work panics.
func (l *Lease) Keep(ctx context.Context, q Querier, limit time.Duration) (workCtx context.Context, stop func(), err error) {
	if err := l.Renew(ctx, q); err != nil {
		return nil, nil, err
	}
	var cancel context.CancelFunc
	if limit > 0 {
		workCtx, cancel = context.WithTimeout(ctx, limit)
	} else {
		workCtx, cancel = context.WithCancel(ctx)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	every := lockttl.RenewInterval(l.TTL)
	wg.Go(func() {
		t := time.NewTicker(every)
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
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), every)
				err := l.Renew(rctx, q)
				rcancel()
				if errors.Is(err, keyrow.ErrLeaseLost) {
					cancel()
					return
				}
			}
		}
	})
	var once sync.Once
	return workCtx, func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			cancel()
		})
	}, nil
}
