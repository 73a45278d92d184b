package ledger_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/atomicphase/atomicphase/phase"
)

func TestZZMeasure(t *testing.T) {
	t.Run("chaos", TestTwentyClientsWithCrashesRetriesAndCompleterConserveMoney)
}

func init() {
	measure = func(l *eventLog) (failed40001, failedOther int) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, ev := range l.events {
			if ev.Kind != phase.EventFailed {
				continue
			}
			var pg *pgconn.PgError
			if errors.As(ev.Err, &pg) && pg.Code == "40001" {
				failed40001++
			} else {
				failedOther++
			}
		}
		return
	}
}
