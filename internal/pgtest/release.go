package pgtest

// Release stops the shared server this package started, or drops the
// template database from an external one, as [Main] does after the tests,
// but without Main's check for leftover goroutines: it is for test binaries
// that run their own TestMain. Tests that ask for a database afterwards
// fail.
func Release() error { return stopShared() }
