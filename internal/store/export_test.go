package store

// WalkBatch is how many keys of separate transactions one step of a
// claim's walk passes at most.
const WalkBatch = walkBatch
