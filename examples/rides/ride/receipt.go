package ride

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// ReceiptArgs is the River job that sends a ride's receipt.
type ReceiptArgs struct {
	RideID int64 `json:"ride_id"`
	// Email is the rider's, to whom the receipt goes: the ride's tenant.
	Email  string `json:"email"`
	Amount int64  `json:"amount"`
}

// Kind names the job for River.
func (ReceiptArgs) Kind() string { return "ride_receipt" }

// ReceiptWorker "sends" receipts by recording them. River runs a job at
// least once; the receipts primary key turns a second run into a no-op, so
// the rider sees at most one receipt per ride.
type ReceiptWorker struct {
	river.WorkerDefaults[ReceiptArgs]
	Pool *pgxpool.Pool
}

// Work records the receipt unless it was already sent.
func (w *ReceiptWorker) Work(ctx context.Context, job *river.Job[ReceiptArgs]) error {
	_, err := w.Pool.Exec(ctx, `
		INSERT INTO receipts (tenant, ride_id, amount) VALUES ($1, $2, $3)
		ON CONFLICT (tenant, ride_id) DO NOTHING`, job.Args.Email, job.Args.RideID, job.Args.Amount)
	if err != nil {
		return fmt.Errorf("send receipt for ride %d: %w", job.Args.RideID, err)
	}
	return nil
}
