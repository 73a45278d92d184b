package store

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/atomicphase/atomicphase/keyrow"
	"github.com/atomicphase/atomicphase/lockttl"
)

// Lease is a held lease on one key row.
type Lease struct {
	Holder
	TTL time.Duration

	// id, token, tenant and TTL as statement arguments, made once for
	// every write.
	idArg, tokenArg, tenantArg, ttlArg any

	mu      sync.Mutex
	lost    chan struct{}
	lostErr error
	// proven is when, by this process's clock, the transaction of the
	// newest statement that found the lease still the holder's and
	// extended it was begun (see Proven).
	proven time.Time
}

// NewLease returns the lease of holder h. A TTL below lockttl.MinTTL is
// raised to it.
func NewLease(h Holder, ttl time.Duration) *Lease {
	ttl = max(ttl, lockttl.MinTTL)
	return &Lease{Holder: h, TTL: ttl, lost: make(chan struct{}),
		idArg: uuidArg(h.ID), tokenArg: uuidArg(h.Token), tenantArg: h.Tenant, ttlArg: intervalArg(ttl)}
}

// Advance is AdvanceWrite for this lease: it commits point and state and
// renews the lease for its TTL, when the key is at from, the recovery point
// the holder last committed or found.
//
// The token proves that no other run took the key over; from proves that
// the database still holds what the holder committed last. After a failover
// to an asynchronous standby, the standby may hold the lease but not the
// holder's last commit: the write then changes nothing and reads as a lost
// lease, so the holder stops and the key resumes from the recovery point the
// database holds, instead of committing a phase over one it lost.
func (l *Lease) Advance(from, point string, state []byte) (Write, error) {
	return advanceWrite(l.Distributed, l.idArg, l.tokenArg, l.tenantArg, from, point, state, l.TTL, l.ttlArg)
}

// Finish is FinishWrite for this lease, from the recovery point from (see
// Advance).
func (l *Lease) Finish(from string, state []byte, resp keyrow.Response) (Write, error) {
	return finishWrite(l.Distributed, l.idArg, l.tokenArg, l.tenantArg, from, state, resp)
}

// Renew extends the lease to TTL from now by the database clock. When the
// key was taken over it returns keyrow.ErrLeaseLost and marks the lease lost.
func (l *Lease) Renew(ctx context.Context, q Querier) error {
	return l.renew(ctx, q, "", "")
}

// renew is Renew, which also marks the foreign call of phase as possibly
// under way when phase is not empty (see markCallSQL), if the key is at
// the recovery point from.
func (l *Lease) renew(ctx context.Context, q Querier, from, phase string) error {
	sent := time.Now()
	h := l.Holder
	h.Point = from
	_, err := renew(ctx, q, h, l.TTL, phase)
	switch {
	case err == nil:
		l.Proven(sent)
	case errors.Is(err, keyrow.ErrLeaseLost):
		l.MarkLost()
	}
	return err
}

// Proven records that a statement found the lease still the holder's and
// extended it to TTL from its transaction's start (now() in Postgres), and
// that this process sent that transaction's first statement at sent, by its
// own clock: the statement that took the lease, a renewal, or a committed
// advance, whose transaction began with the phase. Since the transaction
// started after sent, the lease then had at least TTL - time.Since(sent)
// left.
func (l *Lease) Proven(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sent.After(l.proven) {
		l.proven = sent
	}
}

// ProofWindow is how recent, for a lease of ttl, the last proof that the
// lease is the holder's must be for Keep to start the work without renewing
// it first: a third of the TTL (its renewal interval), at most a second. A
// lease proven that recently has at least two thirds of its TTL left, so no
// other run can have taken the key over by its expiry.
func ProofWindow(ttl time.Duration) time.Duration {
	return min(lockttl.RenewInterval(ttl), time.Second)
}

// proofAge returns how long ago the lease was last proven (see Proven), and
// false when it never was.
func (l *Lease) proofAge() (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Since(l.proven), !l.proven.IsZero()
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

// Keep makes sure the lease is still the holder's, by the database clock,
// and then renews it every lockttl.RenewInterval(TTL) until stop is called,
// for work that may outlast the TTL, such as a foreign call.
//
// The proof comes first: unless a statement whose transaction began within
// ProofWindow found the lease the holder's and extended it (see Proven), as
// the commit of the phase before a foreign call does, Keep renews the lease
// at once. A holder that stalled past its TTL and was taken over gets
// keyrow.ErrLeaseLost here and must not start the work. Any other error of
// that renewal is returned too: the holder cannot tell whether it still
// holds the key. On the happy path, where the work follows a commit at
// once, the proof costs no statement.
//
// The returned context is cancelled when the lease is found lost, when
// limit (if positive) has passed, or when stop is called; the renewals end
// with it, so work that outlives its limit no longer keeps the key, which
// then expires and resumes elsewhere. The first renewal is bounded by ctx
// alone. Later renewal errors other than a lost lease (a store
// hiccup) are retried at the next tick; the lease is still bounded by its
// TTL. The renewals run on a timer, so work that ends before the first is
// due, as most foreign calls do, costs no goroutine. stop waits for a
// renewal under way to end, so a caller that defers it leaves nothing
// running, even when the work panics.
//
// A non-empty mark names a phase whose call is not safe to repeat: Keep
// then always renews first, in a statement that also records the call as
// possibly under way (see markCallSQL), so that a run after a crash during the
// work reconciles the call instead of making it again. The mark is made only
// while the key is at from, the recovery point the holder last committed
// or found (see Advance): a holder whose last commit the database lost
// makes no call.
func (l *Lease) Keep(ctx context.Context, q Querier, limit time.Duration, from, mark string) (workCtx context.Context, stop func(), err error) {
	if err := l.Err(); err != nil {
		return nil, nil, err
	}
	if age, ok := l.proofAge(); mark != "" || !ok || age >= ProofWindow(l.TTL) {
		if err := l.renew(ctx, q, from, mark); err != nil {
			return nil, nil, err
		}
	}
	k := &keeper{lease: l, q: q, ctx: ctx, every: lockttl.RenewInterval(l.TTL)}
	if limit > 0 {
		k.work, k.cancel = context.WithTimeout(ctx, limit)
	} else {
		k.work, k.cancel = context.WithCancel(ctx)
	}
	// The first renewal is due an interval after the last proof, which may
	// predate the work, so that the lease is renewed every interval whether
	// or not Keep had to renew it first.
	age, _ := l.proofAge() // proven by now: Keep renewed or took a proof
	k.mu.Lock()
	k.timer = time.AfterFunc(max(k.every-age, 0), k.renew)
	k.mu.Unlock()
	return k.work, k.stop, nil
}

// keeper renews a lease for Keep while its work runs.
type keeper struct {
	lease *Lease
	q     Querier
	// ctx is Keep's; a renewal is bounded by it and by the interval, not
	// by the work's cancellation.
	ctx    context.Context
	work   context.Context
	cancel context.CancelFunc
	every  time.Duration

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	// renewing counts the renewal under way, which stop waits for.
	renewing sync.WaitGroup
	once     sync.Once
}

// renew runs on the timer's goroutine when a renewal is due; the timer is
// set again only once the renewal has ended, so renewals never overlap.
func (k *keeper) renew() {
	k.mu.Lock()
	if k.stopped || k.work.Err() != nil {
		k.mu.Unlock()
		return
	}
	k.renewing.Add(1)
	k.mu.Unlock()
	defer k.renewing.Done()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(k.ctx), k.every)
	err := k.lease.Renew(rctx, k.q)
	rcancel()
	if errors.Is(err, keyrow.ErrLeaseLost) {
		k.cancel()
		return
	}
	k.mu.Lock()
	if !k.stopped {
		k.timer.Reset(k.every)
	}
	k.mu.Unlock()
}

// stop ends the renewals, waits for one under way, and cancels the work's
// context; calls after the first do nothing.
func (k *keeper) stop() {
	k.once.Do(func() {
		k.mu.Lock()
		k.stopped = true
		k.timer.Stop()
		k.mu.Unlock()
		k.renewing.Wait()
		k.cancel()
	})
}
