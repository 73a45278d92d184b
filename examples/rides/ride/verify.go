package ride

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Report is what Verify found: the service's counts and the invariants a
// retry-safe rides service must keep.
type Report struct {
	Rides         int `json:"rides"`
	ChargedRides  int `json:"charged_rides"`
	Charges       int `json:"charges"`
	Receipts      int `json:"receipts"`
	FinishedKeys  int `json:"finished_keys"`
	Created       int `json:"created"`
	Declined      int `json:"declined"`
	PaymentFailed int `json:"payment_failed"`
	UnfinishedKey int `json:"unfinished_keys"`
	LockedKeys    int `json:"locked_keys"`

	// Violations of invariants; each must be zero.

	// DoubleCharged counts ride requests (a customer's Idempotency-Key)
	// with more than one charge at Stripe.
	DoubleCharged int `json:"double_charged_rides"`
	// ChargesWithoutRide counts charges no ride records.
	ChargesWithoutRide int `json:"charges_without_ride"`
	// ChargeMismatches counts rides recording a charge Stripe does not
	// hold, or one that another ride records too.
	ChargeMismatches  int `json:"charge_mismatches"`
	ReceiptsUncharged int `json:"receipts_for_uncharged_rides"`
	CreatedUncharged  int `json:"created_without_charge"`
}

// Failures lists the invariants the report breaks, empty when all hold.
func (r Report) Failures() []string {
	var out []string
	check := func(n int, what string) {
		if n != 0 {
			out = append(out, fmt.Sprintf("%d %s", n, what))
		}
	}
	check(r.DoubleCharged, "ride requests charged more than once")
	check(r.ChargesWithoutRide, "charges without a ride")
	check(r.ChargeMismatches, "rides recording a charge Stripe does not hold, or one another ride records")
	check(r.ReceiptsUncharged, "receipts for rides that were not charged")
	check(r.CreatedUncharged, "rides answered 201 without a recorded charge")
	return out
}

// Verify lists every charge at Stripe and checks it against the rides: at
// most one charge per ride request (a rider's Idempotency-Key, which each
// charge carries in its metadata), every charge recorded by exactly one
// ride, every recorded charge one that Stripe holds, receipts only for
// charged rides, and every 201 answer backed by a charge. It also counts
// keys left unfinished or locked.
//
// It looks only at the keys created at or after since, and at their rides,
// receipts and charges, so that a run on a database that earlier runs used
// reports its own; a ride whose key the reaper has deleted counts by its own
// creation time. The zero time looks at everything. A charge that no ride in
// the database records counts whenever it was made. Its joins match tenants
// too, as Citus needs to join the distributed tables on their nodes.
//
// Call it once no request is in flight. It reads the keys first, so a
// report that finds every key finished describes runs that had ended.
func Verify(ctx context.Context, pool *pgxpool.Pool, sc *Stripe, since time.Time) (Report, error) {
	var r Report
	// The keys first: when every key was finished then, the rides, charges
	// and receipts read after it are those of finished runs, not of a run
	// still charging between two of these reads.
	err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE k.recovery_point = 'finished'),
		       count(*) FILTER (WHERE k.response_status = 201),
		       count(*) FILTER (WHERE k.response_status = 402),
		       count(*) FILTER (WHERE k.response_status = 502),
		       count(*) FILTER (WHERE k.recovery_point <> 'finished'),
		       count(*) FILTER (WHERE k.lock_token IS NOT NULL),
		       count(*) FILTER (WHERE k.response_status = 201 AND r.stripe_charge_id IS NULL)
		FROM idempotency_keys k LEFT JOIN rides r ON r.tenant = k.tenant AND r.idempotency_key_id = k.id
		WHERE k.workflow = $1 AND k.created_at >= $2`, WorkflowName, since).
		Scan(&r.FinishedKeys, &r.Created, &r.Declined, &r.PaymentFailed,
			&r.UnfinishedKey, &r.LockedKeys, &r.CreatedUncharged)
	if err != nil {
		return r, err
	}
	rows, err := pool.Query(ctx, `
		SELECT coalesce(r.stripe_charge_id, ''), coalesce(k.created_at, r.created_at) >= $1
		FROM rides r LEFT JOIN idempotency_keys k ON k.tenant = r.tenant AND k.id = r.idempotency_key_id`, since)
	if err != nil {
		return r, err
	}
	recorded := map[string]int{} // charge ID → rides looked at recording it
	others := map[string]bool{}  // charges of the rides created before since
	for rows.Next() {
		var charge string
		var looked bool
		if err := rows.Scan(&charge, &looked); err != nil {
			return r, err
		}
		switch {
		case !looked:
			others[charge] = true
		case charge == "":
			r.Rides++
		default:
			r.Rides++
			r.ChargedRides++
			recorded[charge]++
		}
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	type request struct{ customer, key string }
	byRequest := map[request][]string{}
	atStripe := map[string]bool{}
	charges, err := sc.Charges(ctx)
	if err != nil {
		return r, fmt.Errorf("list charges: %w", err)
	}
	for _, ch := range charges {
		if others[ch.ID] {
			continue
		}
		r.Charges++
		atStripe[ch.ID] = true
		req := request{customer: ch.Customer, key: ch.Metadata[ChargeKeyMetadata]}
		byRequest[req] = append(byRequest[req], ch.ID)
	}
	for _, charges := range byRequest {
		if len(charges) > 1 {
			r.DoubleCharged++
		}
	}
	for charge, rides := range recorded {
		if !atStripe[charge] || rides > 1 {
			r.ChargeMismatches += rides
		}
	}
	for charge := range atStripe {
		if recorded[charge] == 0 {
			r.ChargesWithoutRide++
		}
	}
	err = pool.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE r.stripe_charge_id IS NULL)
		FROM receipts rc JOIN rides r ON r.tenant = rc.tenant AND r.id = rc.ride_id
		LEFT JOIN idempotency_keys k ON k.tenant = r.tenant AND k.id = r.idempotency_key_id
		WHERE coalesce(k.created_at, r.created_at) >= $1`, since).Scan(&r.Receipts, &r.ReceiptsUncharged)
	if err != nil {
		return r, err
	}
	return r, nil
}
