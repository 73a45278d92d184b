// Package lockttl is the lease rules: how long a run may hold an
// idempotency key before another run may take it over, how often a
// long-running holder renews it, and what a waiting client is told. The
// client, the completer and the statements that take and fence a lease all
// follow these rules; phase.Config.LeaseTTL sets the one TTL they share.
//
// # Leases
//
// A run holds a key while the row's lock_expires_at lies in the future by the
// database clock. Taking the key and every phase commit set it to now() +
// TTL, and a run renews it every [RenewInterval] while a foreign call runs
// (and before the call, unless a commit just renewed it), so a run that keeps working never
// loses its key; a run that crashes loses it TTL after its last renewal, and
// the next request or the completer takes the key over and resumes it.
//
// # Fencing
//
// Each lease carries a random token. Every write by the holder names the
// token, so a holder that stalled past its TTL and was taken over writes
// nothing: its phase rolls back and the run ends with keyrow.ErrLeaseLost.
// Before a foreign call the holder proves, by the database clock, that the
// lease is still its own; see package phase for the window that remains.
package lockttl

import (
	"fmt"
	"math"
	"time"
)

// DefaultTTL is the lease length used when none is configured: 20 seconds,
// renewed every third of it while a foreign call runs, so a live holder
// keeps its key however slow its provider, and a crashed holder's key is
// free at most 20 seconds after its last renewal: before a client on
// caller's default budget (30 seconds) gives up on the request it was
// waiting for. docs/calling.md has the arithmetic.
const DefaultTTL = 20 * time.Second

// MinTTL is the shortest lease Check accepts. A shorter lease would expire
// between a phase's statements on a loaded machine.
const MinTTL = time.Second

// renewFraction is the share of the TTL after which a holder renews: a
// third, so two renewals in a row can fail before the lease runs out.
const renewFraction = 3

// Check returns an error unless ttl can be used as a lease length.
func Check(ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("lockttl: lease TTL %v is shorter than %v", ttl, MinTTL)
	}
	return nil
}

// RenewInterval is how often a holder renews a lease of length ttl while a
// foreign call runs: a third of it, and never less than a millisecond, so a
// tiny or zero TTL cannot make a ticker panic.
func RenewInterval(ttl time.Duration) time.Duration {
	return max(ttl/renewFraction, time.Millisecond)
}

// MaxRetryAfter caps RetryAfter. Every phase commit renews a lease to a full
// TTL, so the time left on a live lease says little about when its request
// will finish (usually far sooner); a client that retries early only gets
// another cheap 409.
const MaxRetryAfter = 5 * time.Second

// RetryAfter returns how long a client should wait before retrying a key
// whose lease has left to run: the time left, rounded up to whole seconds,
// at least one second (so a client honouring it does not spin) and at most
// MaxRetryAfter.
func RetryAfter(left time.Duration) time.Duration {
	s := math.Ceil(min(left, MaxRetryAfter).Seconds())
	return time.Duration(max(s, 1)) * time.Second
}
