package phase

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/internal/store"
	"github.com/atomicphase/atomicphase/keyrow"
)

// StatusMinute is how many unfinished keys of one workflow were in each
// status at one minute, as a completer recorded them in its first pass of
// that minute; Counts.Finished is always zero.
type StatusMinute struct {
	At       time.Time
	Workflow string
	keyrow.Counts
}

// History returns the unfinished keys of each workflow by status in each
// minute of the last window that a completer recorded, oldest first, one
// StatusMinute per workflow and minute. A minute no completer recorded
// (none ran, or the key table is distributed with Citus) is missing, not
// zero. It reads a table of a few rows a minute, kept for a day, however
// many keys the key table holds; a database whose schema predates it has
// no history.
func (c *Client) History(ctx context.Context, window time.Duration) ([]StatusMinute, error) {
	ms, err := store.History(ctx, c.db, window)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]StatusMinute, len(ms))
	for i, m := range ms {
		out[i] = StatusMinute(m)
	}
	return out, nil
}
