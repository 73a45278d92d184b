package fakestripe

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// MaxKeyLength is the longest Idempotency-Key accepted, as on Stripe.
const MaxKeyLength = 255

// KeyRetention is how long a stored result answers for its key. A key whose
// result is older is new again, as on Stripe, which prunes keys after 24
// hours.
const KeyRetention = 24 * time.Hour

// checkKey rejects an Idempotency-Key header Stripe would refuse. It returns
// nil for an acceptable key or none.
func checkKey(header string) *response {
	if len(strings.TrimSpace(header)) > MaxKeyLength {
		return invalidParam("", "", fmt.Sprintf("Idempotency-Key must be at most %d characters long.", MaxKeyLength))
	}
	return nil
}

// fingerprint identifies a request's parameters, in any order, so that a key
// reused for a different request is caught. The form is hashed in its
// canonical encoding, which sorts names.
func fingerprint(method, path string, form url.Values) []byte {
	sum := sha256.Sum256([]byte(method + " " + path + "\n" + form.Encode()))
	return sum[:]
}

// keyLockClass is the first half of the two-key advisory lock a request
// holds on its idempotency key while it executes (the bytes of "fkst").
const keyLockClass int32 = 0x666b7374

// lockKeySQL takes the key's lock without waiting. The lock is
// transaction-scoped: it is released when the request's transaction commits
// or rolls back, and by Postgres when a crashed process's connection goes, so
// no key is left "in use" for ever. Postgres releases it only after the
// commit is visible, so the next holder always sees the stored result. API
// key and idempotency key are joined by a newline, which neither can contain
// (both travel in HTTP headers). Two keys whose hashes collide cost no more
// than a spurious 409 while both execute.
const lockKeySQL = `SELECT pg_try_advisory_xact_lock($1, hashtext($2 || E'\n' || $3))`

// lockKey takes the lock on an idempotency key for tx and reports whether
// it got it; false means another request with the key is executing.
func lockKey(ctx context.Context, tx pgx.Tx, apiKey, key string) (bool, error) {
	var held bool
	if err := tx.QueryRow(ctx, lockKeySQL, keyLockClass, apiKey, key).Scan(&held); err != nil {
		return false, fmt.Errorf("lock idempotency key: %w", err)
	}
	return held, nil
}

// result is what an idempotency key stores: the response of the request
// that executed under it, and what that request was.
type result struct {
	fingerprint []byte
	requestID   string
	response    response
}

// matches reports whether a request with fingerprint fp is the one that
// stored r.
func (r *result) matches(fp []byte) bool {
	return bytes.Equal(r.fingerprint, fp)
}

const loadResultSQL = `
SELECT fingerprint, request_id, status, body FROM fakestripe_idempotency_keys
WHERE api_key = $1 AND idempotency_key = $2
  AND created_at > now() - make_interval(secs => $3)`

// loadResult returns the live result stored for key, or nil if there is
// none. The caller holds the key's lock, so no result can appear for it
// until the caller's transaction ends.
func loadResult(ctx context.Context, tx pgx.Tx, apiKey, key string) (*result, error) {
	var r result
	err := tx.QueryRow(ctx, loadResultSQL, apiKey, key, KeyRetention.Seconds()).
		Scan(&r.fingerprint, &r.requestID, &r.response.status, &r.response.body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load idempotent result: %w", err)
	}
	return &r, nil
}

// storeResultSQL writes a key's result. The conflict arm is reached only by
// a key whose stored result outlived KeyRetention: the caller holds the
// key's lock and found no live result.
const storeResultSQL = `
INSERT INTO fakestripe_idempotency_keys (api_key, idempotency_key, fingerprint, request_id, status, body)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (api_key, idempotency_key) DO UPDATE
SET fingerprint = excluded.fingerprint, request_id = excluded.request_id,
    status = excluded.status, body = excluded.body, created_at = now()`

// storeResult stores r for key in tx, the transaction that executed the
// request, so the result and the request's effects commit together.
func storeResult(ctx context.Context, tx pgx.Tx, apiKey, key string, r result) error {
	_, err := tx.Exec(ctx, storeResultSQL, apiKey, key, r.fingerprint, r.requestID, r.response.status, r.response.body)
	if err != nil {
		return fmt.Errorf("store idempotent result: %w", err)
	}
	return nil
}

// keyInUse is Stripe's answer to a request whose key another request is
// executing under. Nothing is stored for it.
func keyInUse(key string) response {
	return errorResponse(http.StatusConflict, stripeError{
		Type: "idempotency_error",
		Code: "idempotency_key_in_use",
		Message: "There is currently another in-progress request using this Idempotent Key (that probably means " +
			"you submitted twice, and the other request is still going through): " + key + ". Please try again later.",
	})
}

// keyMismatch is Stripe's answer to a key reused with other parameters.
func keyMismatch(key string) response {
	return errorResponse(http.StatusBadRequest, stripeError{
		Type: "idempotency_error",
		Message: "Keys for idempotent requests can only be used with the same parameters they were first used with. " +
			"Try using a key other than '" + key + "' if you meant to execute a different request.",
	})
}
