package atomicphase

// MigrateWith applies the pending migrations of ms, as Migrate does those of
// Migrations, and returns the ones it applied.
var MigrateWith = migrate
