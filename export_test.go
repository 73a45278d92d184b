package atomicphase

import "context"

// MigrateWith applies the pending migrations of ms, as Migrate does those of
// Migrations, and returns the ones it applied.
func MigrateWith(ctx context.Context, db Beginner, ms []Migration) ([]Migration, error) {
	return migrate(ctx, db, ms, "")
}
