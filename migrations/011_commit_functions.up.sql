-- The writes that commit a phase, as functions, for a key table distributed
-- with Citus. On a single Postgres the runner sends each as one fenced
-- statement (a CTE that raises when the lease is lost) in the same round
-- trip as COMMIT. Citus plans such a CTE in full on every call; a
-- single-table UPDATE it plans on its fast path and keeps the plan of, but
-- an UPDATE that matched no row raises nothing, and COMMIT would then keep
-- the phase's other work after the lease was lost. Each function runs that
-- UPDATE (Citus keeps its plan inside the function as it does a prepared
-- statement's) and raises AP001, as the fenced statements do, when it
-- matched no row: so on Citus too the write travels with COMMIT, and a lost
-- lease rolls the phase back.
--
-- Each body is the statement of package store's distributed form, which a
-- test compares with it. The functions are unused on a single Postgres.

CREATE OR REPLACE FUNCTION atomicphase_advance(uuid, uuid, text, jsonb, interval, text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
    SET recovery_point = $3, phase_state = $4, hold = NULL, failures = 0, call_pending = NULL,
        lock_expires_at = now() + $5::interval
    WHERE id = $1 AND lock_token = $2 AND finished_at IS NULL AND tenant = $6;
    IF NOT FOUND THEN
        PERFORM atomicphase_lease_lost();
    END IF;
END
$$;

COMMENT ON FUNCTION atomicphase_advance(uuid, uuid, text, jsonb, interval, text) IS
    'Commits a phase of the key (id, lease token, recovery point, state, lease TTL, tenant) on a key table distributed with Citus; raises AP001 when the lease is lost.';

CREATE OR REPLACE FUNCTION atomicphase_finish(uuid, uuid, jsonb, integer, jsonb, bytea, text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
    SET recovery_point = 'finished', phase_state = $3, finished_at = now(), last_run_at = now(),
        response_status = $4, response_headers = $5, response_body = $6,
        locked_at = NULL, lock_expires_at = NULL, lock_token = NULL, last_error = NULL, hold = NULL,
        failures = 0, call_pending = NULL
    WHERE id = $1 AND lock_token = $2 AND finished_at IS NULL AND tenant = $7;
    IF NOT FOUND THEN
        PERFORM atomicphase_lease_lost();
    END IF;
END
$$;

COMMENT ON FUNCTION atomicphase_finish(uuid, uuid, jsonb, integer, jsonb, bytea, text) IS
    'Stores the response of the key (id, lease token, state, status, headers, body, tenant) and frees its lease on a key table distributed with Citus; raises AP001 when the lease is lost.';
