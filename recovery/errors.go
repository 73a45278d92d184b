package recovery

import "errors"

// ErrHandedBack is wrapped by the error of a completer's run for a key it
// handed back for someone else to act on (a process that runs its
// definition, an operator): the completer cannot do more with it now, and
// counts it in PassResult.HandedBack.
var ErrHandedBack = errors.New("recovery: key handed back for another process")
