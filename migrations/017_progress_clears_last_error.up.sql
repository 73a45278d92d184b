-- A phase commit clears the error of the key's last failed run, as it
-- already reset the count of its failures: the key has got past it. A key
-- that failed once, then committed a phase and was left by a crash, no
-- longer shows an error it has moved on from.
--
-- On a single Postgres the runner sends the statement itself; this is the
-- form it calls on a key table distributed with Citus (migration 013), and
-- the processes of earlier releases calling it clear the error too.

CREATE OR REPLACE FUNCTION atomicphase_advance_from(uuid, uuid, text, jsonb, interval, text, text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
    SET recovery_point = $3, phase_state = $4, hold = NULL, failures = 0, last_error = NULL, call_pending = NULL,
        lock_expires_at = now() + $5::interval
    WHERE id = $1 AND lock_token = $2 AND recovery_point = $6 AND finished_at IS NULL AND tenant = $7;
    IF NOT FOUND THEN
        PERFORM atomicphase_lease_lost();
    END IF;
END
$$;

COMMENT ON COLUMN idempotency_keys.last_error IS
    'The error that ended the key''s last failed run, for operators; cleared when a run commits a phase of the key or finishes it.';
