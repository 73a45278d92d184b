// Package ride is the rides example: a Go port of Brandur Leach's
// rocket-rides-atomic on atomicphase. POST /rides creates a ride, charges
// the rider through Stripe exactly once, and queues a receipt, however often
// the client retries and wherever the server crashes.
//
// Improvements over the original: the Stripe call runs outside any
// database transaction; every write is fenced by the lease token; a
// timeout after the charge request was sent is not stored as a final 503
// but resumed, repeating the call with the same Stripe idempotency key; the
// receipt job is enqueued with River in the final phase's transaction.
package ride

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/atomicphase/atomicphase/phase"
)

// WorkflowName is stored with every rides key.
const WorkflowName = "rides"

// Amount is what every ride costs, in US cents, as in the original.
const Amount = 2000

// Request is a ride request.
type Request struct {
	OriginLat float64 `json:"origin_lat"`
	OriginLon float64 `json:"origin_lon"`
	TargetLat float64 `json:"target_lat"`
	TargetLon float64 `json:"target_lon"`
}

// State is what the phases pass on to each other, committed with each.
type State struct {
	RideID     int64  `json:"ride_id"`
	UserID     int64  `json:"user_id"`
	CustomerID string `json:"customer_id"`
	ChargeID   string `json:"charge_id,omitempty"`
}

// Run is a run of the rides workflow.
type Run = phase.Input[Request, State]

// Created is the 201 body of a ride.
type Created struct {
	Message string `json:"message"`
	RideID  int64  `json:"ride_id"`
}

// Failure is the body of a stored error response.
type Failure struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// charge is the outcome of the Stripe call: a charge, or a Stripe error that
// proves no charge was made.
type charge struct {
	ID  string
	Err *StripeError
}

// NewWorkflow declares the rides workflow: started → ride_created →
// charge_created → (receipt queued, response stored) finished.
func NewWorkflow(sc *Stripe, jobs *river.Client[pgx.Tx]) (*phase.Workflow[Request, State], error) {
	return newWorkflow(sc, jobs, false)
}

// NewCheckedWorkflow declares the next definition of the rides workflow,
// as a deploy brings it: a fraud check between the ride and its charge
// (started → ride_created → fraud_checked → charge_created → finished). A
// process that serves it keeps NewWorkflow's definition registered too, so
// that rides started before the deploy finish as they began, without a
// check, and rides started after it are never charged unchecked by a
// process that has not been upgraded yet (see docs/changing-a-workflow.md).
func NewCheckedWorkflow(sc *Stripe, jobs *river.Client[pgx.Tx]) (*phase.Workflow[Request, State], error) {
	return newWorkflow(sc, jobs, true)
}

func newWorkflow(sc *Stripe, jobs *river.Client[pgx.Tx], fraudCheck bool) (*phase.Workflow[Request, State], error) {
	phases := []phase.Phase[Request, State]{phase.Local("ride_created", createRide)}
	if fraudCheck {
		phases = append(phases, phase.Local(FraudCheckPhase, checkFraud))
	}
	return phase.NewWorkflow(WorkflowName, append(phases,
		phase.Foreign("charge_created",
			func(ctx context.Context, in *Run) (charge, error) { return chargeRide(ctx, sc, in) },
			recordCharge,
		).Repeatable(),
		phase.Local("receipt_queued", func(ctx context.Context, tx pgx.Tx, in *Run) (phase.Result, error) {
			return queueReceipt(ctx, tx, jobs, in)
		}),
	)...)
}

// FraudCheckPhase is the phase NewCheckedWorkflow adds; it leaves an audit
// record with this action for every ride it checks.
const FraudCheckPhase = "fraud_checked"

// checkFraud stands for a fraud check: it reads the rider's rides and
// records that the ride was checked, in the phase's transaction.
//
// Every statement of a phase names the key's tenant (in.Tenant, the
// rider's email), so that on Citus it runs on the node that holds the key.
func checkFraud(ctx context.Context, tx pgx.Tx, in *Run) (phase.Result, error) {
	_, err := tx.Exec(ctx, `
		INSERT INTO audit_records (tenant, action, data, resource_id, resource_type, user_id)
		SELECT $1, $2, jsonb_build_object('rides_today', count(*)), $3, 'ride', $4
		FROM rides WHERE tenant = $1 AND user_id = $4 AND created_at > now() - interval '1 day'`,
		in.Tenant, FraudCheckPhase, in.State.RideID, in.State.UserID)
	if err != nil {
		return phase.Result{}, fmt.Errorf("fraud check: %w", err)
	}
	return phase.Next(), nil
}

func createRide(ctx context.Context, tx pgx.Tx, in *Run) (phase.Result, error) {
	err := tx.QueryRow(ctx, `SELECT id, stripe_customer_id FROM users WHERE email = $1`, in.Tenant).
		Scan(&in.State.UserID, &in.State.CustomerID)
	if err != nil {
		return phase.Result{}, fmt.Errorf("look up user: %w", err)
	}
	r := in.Req
	err = tx.QueryRow(ctx, `
		INSERT INTO rides (tenant, idempotency_key_id, user_id, origin_lat, origin_lon, target_lat, target_lon)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
		in.Tenant, in.ID, in.State.UserID, r.OriginLat, r.OriginLon, r.TargetLat, r.TargetLon).Scan(&in.State.RideID)
	if err != nil {
		return phase.Result{}, fmt.Errorf("insert ride: %w", err)
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO audit_records (tenant, action, data, resource_id, resource_type, user_id)
		VALUES ($1, 'created', $2, $3, 'ride', $4)`, in.Tenant, r, in.State.RideID, in.State.UserID)
	if err != nil {
		return phase.Result{}, fmt.Errorf("insert audit record: %w", err)
	}
	return phase.Next(), nil
}

// chargeRide makes the one Stripe call of the workflow. The downstream
// idempotency key makes a repeat after a crash or a timeout return the
// original charge instead of charging twice.
//
// Every parameter comes from the request and the rider, never from a row
// the workflow wrote: after a failover to an asynchronous standby the key
// row and the ride can be lost, and the retry creates a new ride with a new
// ID. It sends the same downstream key, and Stripe replays the first charge
// only if the parameters are the same too; with the ride's ID among them,
// Stripe would refuse the retry with an idempotency_error. Charges are
// found by the Idempotency-Key they carry in their metadata
// (ChargeKeyMetadata), and rides by the charge ID they record.
func chargeRide(ctx context.Context, sc *Stripe, in *Run) (charge, error) {
	ch, err := sc.CreateCharge(ctx, ChargeParams{
		Amount:      Amount,
		Currency:    "usd",
		Customer:    in.State.CustomerID,
		Description: "Ride requested with Idempotency-Key " + in.Key,
		Metadata:    map[string]string{ChargeKeyMetadata: in.Key},
	}, in.DownstreamKey())
	if err == nil {
		return charge{ID: ch.ID}, nil
	}
	var serr *StripeError
	if errors.As(err, &serr) && definite(serr) {
		return charge{Err: serr}, nil
	}
	// A network error, a timeout or a Stripe 5xx: the charge may or may not
	// exist. The phase is Repeatable, so the next run asks again with the
	// same key and Stripe answers with whatever happened.
	return charge{}, phase.MaybeHappened(err)
}

// ChargeKeyMetadata is the metadata key under which a charge carries the
// Idempotency-Key of the ride request it pays for.
const ChargeKeyMetadata = "idempotency_key"

// definite reports a Stripe error that proves no charge was made: a decline
// or a request Stripe refused (4xx), except the ones that mean "try again"
// (409: the same key is still being processed; 429: rate limited) and an
// idempotency_error, which says the key was already used with other
// parameters: by an earlier call that may have charged.
func definite(err *StripeError) bool {
	if err.Type == ErrorTypeCard {
		return true
	}
	if err.Type == ErrorTypeIdempotency {
		return false
	}
	switch err.HTTPStatusCode {
	case http.StatusConflict, http.StatusTooManyRequests:
		return false
	}
	return err.HTTPStatusCode >= 400 && err.HTTPStatusCode < 500
}

func recordCharge(ctx context.Context, tx pgx.Tx, in *Run, c charge) (phase.Result, error) {
	if c.Err != nil {
		if c.Err.Type == ErrorTypeCard {
			return phase.JSON(http.StatusPaymentRequired, Failure{Error: "card_declined", Message: c.Err.Msg}), nil
		}
		return phase.JSON(http.StatusBadGateway, Failure{Error: "payment_failed",
			Message: "the payment provider refused the charge and no charge was made: " + c.Err.Msg}), nil
	}
	in.State.ChargeID = c.ID
	if _, err := tx.Exec(ctx, `UPDATE rides SET stripe_charge_id = $3 WHERE tenant = $1 AND id = $2`,
		in.Tenant, in.State.RideID, c.ID); err != nil {
		return phase.Result{}, fmt.Errorf("record charge: %w", err)
	}
	return phase.Next(), nil
}

// queueReceipt enqueues the receipt job in the phase's own transaction, so
// the job exists if and only if the ride's response is stored.
func queueReceipt(ctx context.Context, tx pgx.Tx, jobs *river.Client[pgx.Tx], in *Run) (phase.Result, error) {
	_, err := jobs.InsertTx(ctx, tx, ReceiptArgs{RideID: in.State.RideID, Email: in.Tenant, Amount: Amount}, nil)
	if err != nil {
		return phase.Result{}, fmt.Errorf("enqueue receipt: %w", err)
	}
	return phase.JSON(http.StatusCreated, Created{
		Message: "Payment accepted. Your pilot is on their way!",
		RideID:  in.State.RideID,
	}), nil
}
