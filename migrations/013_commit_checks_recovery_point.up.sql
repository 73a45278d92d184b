-- The writes that commit a phase, and the mark made before a foreign call
-- that is not safe to repeat, match the key's recovery point as well as
-- its lease token: a run changes the key only while the key is where the
-- run last committed it.
--
-- The token alone proves that no other run took the key over, not that the
-- database still holds the run's own last commit. After a failover to an
-- asynchronous standby, the standby may hold the run's lease but not the
-- phase it committed last; a run that went on would then commit its next
-- phase over a key that never ran the one before, and the key would finish
-- without that phase's work (a ride answered 201 that the database no
-- longer has, with a charge no ride records). Matching the recovery point,
-- the run stops as if it had lost its lease, and the key resumes from the
-- last phase the database holds.
--
-- On a single Postgres the runner sends the statements themselves; these
-- functions are the forms it calls on a key table distributed with Citus.
-- They take the recovery point the run expects as their last parameter
-- but one (the tenant stays last), and keep the names of migration 011's
-- free for the processes of earlier releases during a rollout.

CREATE OR REPLACE FUNCTION atomicphase_advance_from(uuid, uuid, text, jsonb, interval, text, text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
    SET recovery_point = $3, phase_state = $4, hold = NULL, failures = 0, call_pending = NULL,
        lock_expires_at = now() + $5::interval
    WHERE id = $1 AND lock_token = $2 AND recovery_point = $6 AND finished_at IS NULL AND tenant = $7;
    IF NOT FOUND THEN
        PERFORM atomicphase_lease_lost();
    END IF;
END
$$;

COMMENT ON FUNCTION atomicphase_advance_from(uuid, uuid, text, jsonb, interval, text, text) IS
    'Commits a phase of the key (id, lease token, recovery point, state, lease TTL, the recovery point it leaves, tenant) on a key table distributed with Citus; raises AP001 when the lease is lost or the key is not at the recovery point it leaves.';

CREATE OR REPLACE FUNCTION atomicphase_finish_from(uuid, uuid, jsonb, integer, jsonb, bytea, text, text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
    SET recovery_point = 'finished', phase_state = $3, finished_at = now(),
        response_status = $4, response_headers = $5, response_body = $6,
        locked_at = NULL, lock_expires_at = NULL, lock_token = NULL, last_error = NULL, hold = NULL,
        failures = 0, call_pending = NULL
    WHERE id = $1 AND lock_token = $2 AND recovery_point = $7 AND finished_at IS NULL AND tenant = $8;
    IF NOT FOUND THEN
        PERFORM atomicphase_lease_lost();
    END IF;
END
$$;

COMMENT ON FUNCTION atomicphase_finish_from(uuid, uuid, jsonb, integer, jsonb, bytea, text, text) IS
    'Stores the response of the key (id, lease token, state, status, headers, body, the recovery point it leaves, tenant) and frees its lease on a key table distributed with Citus; raises AP001 when the lease is lost or the key is not at the recovery point it leaves.';
