package lockttl_test

import (
	"testing"
	"time"

	"github.com/atomicphase/atomicphase/lockttl"
)

func TestRetryAfterRoundsUpWithinOneToFiveSeconds(t *testing.T) {
	for _, tc := range []struct{ left, want time.Duration }{
		{0, time.Second}, {-time.Second, time.Second}, {time.Millisecond, time.Second}, {time.Second, time.Second},
		{1500 * time.Millisecond, 2 * time.Second}, {4200 * time.Millisecond, 5 * time.Second}, {90 * time.Second, 5 * time.Second},
	} {
		if got := lockttl.RetryAfter(tc.left); got != tc.want {
			t.Errorf("RetryAfter(%v) = %v, want %v", tc.left, got, tc.want)
		}
	}
}

func TestRenewIntervalIsAThirdAndNeverZero(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{
		{90 * time.Second, 30 * time.Second}, {3 * time.Second, time.Second}, {0, time.Millisecond}, {-time.Second, time.Millisecond}, {time.Nanosecond, time.Millisecond},
	} {
		if got := lockttl.RenewInterval(tc.ttl); got != tc.want {
			t.Errorf("RenewInterval(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
	}
}

func TestCheckRefusesLeasesShorterThanMinTTL(t *testing.T) {
	for _, ttl := range []time.Duration{-time.Second, 0, lockttl.MinTTL - 1} {
		if lockttl.Check(ttl) == nil {
			t.Errorf("Check(%v) = nil, want an error", ttl)
		}
	}
	for _, ttl := range []time.Duration{lockttl.MinTTL, lockttl.DefaultTTL} {
		if err := lockttl.Check(ttl); err != nil {
			t.Errorf("Check(%v) = %v, want nil", ttl, err)
		}
	}
}
