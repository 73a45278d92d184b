package pgcluster

// BouncerInstalled reports whether StartBouncer would find the pgbouncer
// program, and if not, why (ErrNoBouncer), without starting it: for a test
// that chooses a route before it asks for one.
func BouncerInstalled() error {
	_, err := findBouncer()
	return err
}
