-- Downstream idempotency keys are derived from the tenant, the key, the
-- request's fingerprint and the phase, not from the row's id: say so where
-- operators read the table.

COMMENT ON COLUMN idempotency_keys.id IS
    'Row identity; the library writes UUIDv7s, so new rows go to the right edge of the primary key. Downstream idempotency keys are not derived from it but from the tenant, the key, the request fingerprint and the phase, so they survive the loss of the row.';
