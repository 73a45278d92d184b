package payoutprovider

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// fingerprint identifies a payout request's parameters, so that a key reused
// for another payout is caught. The parameters are hashed as their struct
// encodes, which fixes the field order whatever order the client sent.
func fingerprint(p PayoutParams) []byte {
	b, _ := json.Marshal(p) // a struct of strings and an int always encodes
	sum := sha256.Sum256(b)
	return sum[:]
}

// keyLockClass is the first half of the two-key advisory lock a request
// holds on its idempotency key while it executes (the bytes of "pout").
const keyLockClass int32 = 0x706f7574

// lockKeySQL takes the key's lock without waiting. The lock is
// transaction-scoped: it is released when the request's transaction commits
// or rolls back, and by Postgres when a crashed process's connection goes,
// so no key is left "in use" for ever. Postgres releases it only after the
// commit is visible, so the next holder always sees the stored result. Two
// keys whose hashes collide cost no more than a spurious 409.
const lockKeySQL = `SELECT pg_try_advisory_xact_lock($1, hashtext($2))`

// lockKey takes the lock on key for tx and reports whether it got it; false
// means another request with the key is executing.
func lockKey(ctx context.Context, tx pgx.Tx, key string) (bool, error) {
	var held bool
	if err := tx.QueryRow(ctx, lockKeySQL, keyLockClass, key).Scan(&held); err != nil {
		return false, fmt.Errorf("lock idempotency key: %w", err)
	}
	return held, nil
}

// result is what an idempotency key stores: the response of the request
// that executed under it, and which parameters that request had.
type result struct {
	fingerprint []byte
	response    response
}

func (r *result) matches(fp []byte) bool { return bytes.Equal(r.fingerprint, fp) }

const loadResultSQL = `
SELECT fingerprint, status, body FROM payoutprovider_idempotency_keys
WHERE idempotency_key = $1`

// loadResult returns the result stored for key, or nil if there is none.
// The caller holds the key's lock, so no result can appear for it until the
// caller's transaction ends.
func loadResult(ctx context.Context, tx pgx.Tx, key string) (*result, error) {
	var r result
	err := tx.QueryRow(ctx, loadResultSQL, key).Scan(&r.fingerprint, &r.response.status, &r.response.body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load idempotent result: %w", err)
	}
	return &r, nil
}

// storeResult stores r for key in tx, the transaction that made the payout,
// so the result and the payout commit together. The caller holds the key's
// lock and found no result, so the insert cannot conflict.
func storeResult(ctx context.Context, tx pgx.Tx, key string, r result) error {
	_, err := tx.Exec(ctx, `INSERT INTO payoutprovider_idempotency_keys (idempotency_key, fingerprint, status, body) VALUES ($1, $2, $3, $4)`,
		key, r.fingerprint, r.response.status, r.response.body)
	if err != nil {
		return fmt.Errorf("store idempotent result: %w", err)
	}
	return nil
}
