package ride

import (
	"context"
	"fmt"

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
func Verify(ctx context.Context, pool *pgxpool.Pool, sc *stripe.Client) (Report, error) {
	var r Report
	type request struct{ customer, key string }
	byRequest := map[request][]string{}
	atStripe := map[string]bool{}
	for ch, err := range sc.V1Charges.List(ctx, &stripe.ChargeListParams{ListParams: stripe.ListParams{Limit: stripe.Int64(100)}}).All(ctx) {
		if err != nil {
			return r, fmt.Errorf("list charges: %w", err)
		}
		r.Charges++
		atStripe[ch.ID] = true
		req := request{key: ch.Metadata[ChargeKeyMetadata]}
		if ch.Customer != nil {
			req.customer = ch.Customer.ID
		}
		byRequest[req] = append(byRequest[req], ch.ID)
	}
	for _, charges := range byRequest {
		if len(charges) > 1 {
			r.DoubleCharged++
		}
	}
	rows, err := pool.Query(ctx, `SELECT coalesce(stripe_charge_id, '') FROM rides`)
	if err != nil {
		return r, err
	}
	recorded := map[string]int{} // charge ID → rides recording it
	for rows.Next() {
		var charge string
		if err := rows.Scan(&charge); err != nil {
			return r, err
		}
		r.Rides++
		if charge == "" {
			continue
		}
		r.ChargedRides++
		recorded[charge]++
	}
	if err := rows.Err(); err != nil {
		return r, err
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
		SELECT (SELECT count(*) FROM receipts),
		       (SELECT count(*) FROM receipts rc JOIN rides r ON r.id = rc.ride_id WHERE r.stripe_charge_id IS NULL),
		       count(*) FILTER (WHERE k.recovery_point = 'finished'),
		       count(*) FILTER (WHERE k.response_status = 201),
		       count(*) FILTER (WHERE k.response_status = 402),
		       count(*) FILTER (WHERE k.recovery_point <> 'finished'),
		       count(*) FILTER (WHERE k.lock_token IS NOT NULL),
		       count(*) FILTER (WHERE k.response_status = 201 AND r.stripe_charge_id IS NULL)
		FROM idempotency_keys k LEFT JOIN rides r ON r.idempotency_key_id = k.id
		WHERE k.workflow = $1`, WorkflowName).
		Scan(&r.Receipts, &r.ReceiptsUncharged, &r.FinishedKeys, &r.Created, &r.Declined, &r.UnfinishedKey, &r.LockedKeys, &r.CreatedUncharged)
	return r, err
}
