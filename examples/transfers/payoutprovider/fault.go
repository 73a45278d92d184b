package payoutprovider

import "github.com/atomicphase/atomicphase/examples/internal/fakeapi"

// Faults is a Server's plan of failures (see fakeapi.Faults), which
// Server.Faults returns and Server.SetFaults replaces. Only payout requests
// about to execute draw from it: requests rejected by validation, refused
// with 409 or answered from a stored result never consume a fault.
type Faults = fakeapi.Faults
