package ride

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v85"
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
	DoubleCharged      int `json:"double_charged_rides"`
	ChargesWithoutRide int `json:"charges_without_ride"`
	ChargeMismatches   int `json:"charge_mismatches"`
	ReceiptsUncharged  int `json:"receipts_for_uncharged_rides"`
	CreatedUncharged   int `json:"created_without_charge"`
}

// Failures lists the invariants the report breaks, empty when all hold.
func (r Report) Failures() []string {
	var out []string
	check := func(n int, what string) {
		if n != 0 {
			out = append(out, fmt.Sprintf("%d %s", n, what))
		}
	}
	check(r.DoubleCharged, "rides charged more than once")
	check(r.ChargesWithoutRide, "charges without a ride")
	check(r.ChargeMismatches, "rides whose recorded charge is not the one Stripe holds")
	check(r.ReceiptsUncharged, "receipts for rides that were not charged")
	check(r.CreatedUncharged, "rides answered 201 without a recorded charge")
	return out
}

// Verify lists every charge at Stripe and checks it against the rides:
// at most one charge per ride, no charge without a ride, the recorded charge
// is the one Stripe holds, receipts only for charged rides, and every 201
// answer has a charge. It also counts keys left unfinished or locked.
//
// It looks only at the keys created at or after since, and at their rides,
// receipts and charges, so that a run on a database that earlier runs used
// reports its own; a ride whose key the reaper has deleted counts by its own
// creation time. The zero time looks at everything. A charge that names no
// ride in the database counts whenever it was made.
func Verify(ctx context.Context, pool *pgxpool.Pool, sc *stripe.Client, since time.Time) (Report, error) {
	var r Report
	rows, err := pool.Query(ctx, `
		SELECT r.id, coalesce(r.stripe_charge_id, ''), coalesce(k.created_at, r.created_at) >= $1
		FROM rides r LEFT JOIN idempotency_keys k ON k.id = r.idempotency_key_id`, since)
	if err != nil {
		return r, err
	}
	recorded := map[int64]string{} // the rides looked at, and their charges
	others := map[int64]bool{}     // the rides created before since
	for rows.Next() {
		var id int64
		var charge string
		var looked bool
		if err := rows.Scan(&id, &charge, &looked); err != nil {
			return r, err
		}
		if looked {
			recorded[id] = charge
		} else {
			others[id] = true
		}
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	r.Rides = len(recorded)
	chargesByRide := map[int64][]string{}
	for ch, err := range sc.V1Charges.List(ctx, &stripe.ChargeListParams{ListParams: stripe.ListParams{Limit: stripe.Int64(100)}}).All(ctx) {
		if err != nil {
			return r, fmt.Errorf("list charges: %w", err)
		}
		id, err := strconv.ParseInt(ch.Metadata["ride_id"], 10, 64)
		switch {
		case err == nil && others[id]:
			continue
		case err != nil:
			r.Charges++
			r.ChargesWithoutRide++
		default:
			r.Charges++
			chargesByRide[id] = append(chargesByRide[id], ch.ID)
		}
	}
	for id, charges := range chargesByRide {
		rec, ok := recorded[id]
		switch {
		case !ok:
			r.ChargesWithoutRide += len(charges)
		case len(charges) > 1:
			r.DoubleCharged++
		case rec != "" && rec != charges[0]:
			r.ChargeMismatches++
		}
	}
	for id, rec := range recorded {
		if rec == "" {
			continue
		}
		r.ChargedRides++
		if len(chargesByRide[id]) == 0 {
			r.ChargeMismatches++
		}
	}
	err = pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM receipts rc JOIN rides r ON r.id = rc.ride_id
		        LEFT JOIN idempotency_keys k ON k.id = r.idempotency_key_id
		        WHERE coalesce(k.created_at, r.created_at) >= $2),
		       (SELECT count(*) FROM receipts rc JOIN rides r ON r.id = rc.ride_id
		        LEFT JOIN idempotency_keys k ON k.id = r.idempotency_key_id
		        WHERE coalesce(k.created_at, r.created_at) >= $2 AND r.stripe_charge_id IS NULL),
		       count(*) FILTER (WHERE k.recovery_point = 'finished'),
		       count(*) FILTER (WHERE k.response_status = 201),
		       count(*) FILTER (WHERE k.response_status = 402),
		       count(*) FILTER (WHERE k.response_status = 502),
		       count(*) FILTER (WHERE k.recovery_point <> 'finished'),
		       count(*) FILTER (WHERE k.lock_token IS NOT NULL),
		       count(*) FILTER (WHERE k.response_status = 201 AND r.stripe_charge_id IS NULL)
		FROM idempotency_keys k LEFT JOIN rides r ON r.idempotency_key_id = k.id
		WHERE k.workflow = $1 AND k.created_at >= $2`, WorkflowName, since).
		Scan(&r.Receipts, &r.ReceiptsUncharged, &r.FinishedKeys, &r.Created, &r.Declined, &r.PaymentFailed,
			&r.UnfinishedKey, &r.LockedKeys, &r.CreatedUncharged)
	return r, err
}
