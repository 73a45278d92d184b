-- atomicphase schema: the whole current schema in one script, the sum of the
-- numbered migrations in migrations/. Migrate applies those instead and
-- records their versions; this file is for reading, and for teams that apply
-- SQL by hand or with their own migration tool. Safe to apply more than once:
-- every statement is idempotent.
--
-- The table has no CHECK constraints: Postgres re-reads and re-plans each
-- one on every INSERT and UPDATE of the row, which on this hot, narrow row
-- cost more than the statements themselves. The rules they stated hold all
-- the same: the library validates every value before it writes it, and each
-- of its statements keeps the row-wide rules by construction (a lease token
-- always has its expiry; a finished key always has its finish time and its
-- response). See migrations/003_drop_row_checks.up.sql.

CREATE TABLE IF NOT EXISTS idempotency_keys (
    id                  uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    created_at          timestamptz NOT NULL DEFAULT now(),
    last_run_at         timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    tenant              text        NOT NULL,
    idempotency_key     text        NOT NULL,
    workflow            text        NOT NULL,
    request_fingerprint bytea       NOT NULL,
    request_params      jsonb       NOT NULL,
    recovery_point      text        NOT NULL DEFAULT 'started',
    phase_state         jsonb       NOT NULL DEFAULT 'null',
    hold                text,
    locked_at           timestamptz,
    lock_expires_at     timestamptz,
    lock_token          uuid,
    response_status     integer,
    response_headers    jsonb,
    response_body       bytea,
    attempts            integer     NOT NULL DEFAULT 0,
    last_error          text,
    failures            integer     NOT NULL DEFAULT 0,
    definition          text        NOT NULL DEFAULT '',
    call_pending        text,
    resolution          jsonb,
    retain_for          interval,
    created_xid         xid8        DEFAULT pg_current_xact_id(),

    CONSTRAINT idempotency_keys_tenant_key UNIQUE (tenant, idempotency_key)
)
-- Free space in every page lets a phase commit rewrite its row in the same
-- page (a HOT update), with no new index entries.
WITH (fillfactor = 80);

COMMENT ON TABLE idempotency_keys IS
    'One row per (tenant, idempotency key): the request, how far its atomic phases got, who holds it, and the response to replay.';
COMMENT ON COLUMN idempotency_keys.id IS
    'Row identity; the library writes UUIDv7s, so new rows go to the right edge of the primary key. Downstream idempotency keys are not derived from it but from the tenant, the key, the request fingerprint and the phase, so they survive the loss of the row.';
COMMENT ON COLUMN idempotency_keys.created_at IS
    'When the key was first seen; for operators and for the age of abandoned keys.';
COMMENT ON COLUMN idempotency_keys.last_run_at IS
    'When a client''s run last took the lease, or any run gave it back unfinished (a completer''s run cut short by its process stopping leaves it); the completer waits for it to age before picking the key up, and backs off from it. A completer''s claim leaves it as it was, and so does a finish: finished_at says when.';
COMMENT ON COLUMN idempotency_keys.finished_at IS
    'When the response was stored (NULL until then); the reaper measures retention from it. No index names it, so that storing the response is a HOT update.';
COMMENT ON COLUMN idempotency_keys.tenant IS
    'Whose key this is (account, user); keys are unique per tenant, never globally, so tenants cannot collide or probe each other.';
COMMENT ON COLUMN idempotency_keys.idempotency_key IS
    'The client''s Idempotency-Key, 1 to 255 characters as Stripe allows.';
COMMENT ON COLUMN idempotency_keys.workflow IS
    'Name of the workflow that owns the key; the completer looks it up to resume the key without its client.';
COMMENT ON COLUMN idempotency_keys.request_fingerprint IS
    'SHA-256 of the request as the client sent it (its target and canonical body); a retry with another payload is refused instead of replayed. Keys with an empty definition hold the earlier fingerprint, of the workflow name and the re-encoded request.';
COMMENT ON COLUMN idempotency_keys.request_params IS
    'The decoded request, kept so a crashed request can be resumed by the completer when its client never comes back.';
COMMENT ON COLUMN idempotency_keys.recovery_point IS
    'Name of the last committed phase (started before any, finished at the end); a resumed run starts after it.';
COMMENT ON COLUMN idempotency_keys.phase_state IS
    'The workflow''s typed state, committed with each phase so later phases and resumed runs read what earlier phases produced.';
COMMENT ON COLUMN idempotency_keys.hold IS
    'Why an unfinished key must not run: unknown (a foreign call''s outcome awaits reconciliation) or dead (the completer gave up on it while no client was retrying). NULL means runnable.';
COMMENT ON COLUMN idempotency_keys.locked_at IS
    'When the current holder took the lease; for operators. NULL when nobody runs the key.';
COMMENT ON COLUMN idempotency_keys.lock_expires_at IS
    'End of the current lease by the database clock; after it another request or the completer may take the key over.';
COMMENT ON COLUMN idempotency_keys.lock_token IS
    'Fencing token of the current holder; every write by a holder requires it, so a holder whose lease was taken over changes nothing.';
COMMENT ON COLUMN idempotency_keys.response_status IS
    'Stored HTTP status, replayed on every retry once the key is finished.';
COMMENT ON COLUMN idempotency_keys.response_headers IS
    'Stored response headers (name to list of values) that describe the resource, replayed with the status; never cookies, credentials, hop-by-hop headers or Date (see phase.StoreConfig).';
COMMENT ON COLUMN idempotency_keys.response_body IS
    'Stored response body, byte for byte, so a replay is identical to the first answer.';
COMMENT ON COLUMN idempotency_keys.attempts IS
    'How many runs took the lease, by clients and by the completer.';
COMMENT ON COLUMN idempotency_keys.last_error IS
    'The error that ended the key''s last failed run, for operators; cleared when a run commits a phase of the key or finishes it.';
COMMENT ON COLUMN idempotency_keys.failures IS
    'Failed runs of the completer since the key last made progress; client retries do not count. Drives the completer''s backoff, and the move to dead of an idle key.';
COMMENT ON COLUMN idempotency_keys.definition IS
    'Identity of the workflow definition the key started under (phase.Workflow.Definition); only a process that registered it, or adopts it, resumes the key. Empty for keys written before definitions were recorded.';
COMMENT ON COLUMN idempotency_keys.call_pending IS
    'The phase whose foreign call, not safe to repeat, was about to be sent when this was written; cleared when the phase commits or the call fails for sure. A run that finds it set reconciles the call instead of sending it again.';
COMMENT ON COLUMN idempotency_keys.retain_for IS
    'How long the key is kept once finished, recorded when it was created (phase.StoreConfig.Retention); no reaper deletes it sooner. NULL for keys written before retentions were recorded: the reaper of their workflow applies its own.';

COMMENT ON COLUMN idempotency_keys.created_xid IS
    'The transaction that created the key; the completer walks keys in this order, once each. NULL for keys written before it was recorded, and on a key table distributed with Citus.';

COMMENT ON COLUMN idempotency_keys.resolution IS
    'An operator''s resolution of an unknown outcome, for the phase after the recovery point it names: happened (with the call''s output) or not happened. The next run takes it (and clears it) instead of calling the phase''s reconcile function. NULL almost always.';

-- No index names a column that storing the response changes (finished_at,
-- the response, the lease), so that the finish, like a phase commit, is a
-- HOT update: the row is rewritten in its page, and no index gains an
-- entry. A column in an index predicate counts too.

-- The completer's walk: keys in the order of the transactions that created
-- them. Never updated.
CREATE INDEX IF NOT EXISTS idempotency_keys_created_xid
    ON idempotency_keys (created_xid)
    WHERE created_xid IS NOT NULL;

-- Keys parked for operators or reconciliation, listed by the ops tooling,
-- and claimed for reconciliation by age of their last run. Neither column
-- changes when a runnable key finishes.
CREATE INDEX IF NOT EXISTS idempotency_keys_held
    ON idempotency_keys (hold, last_run_at)
    WHERE hold IS NOT NULL;

-- The reaper's scan: the keys of one workflow by age. A key finishes after
-- it is created, so the keys whose retention is over are among the oldest.
-- Each reaper deletes only the keys of the workflows its process runs.
CREATE INDEX IF NOT EXISTS idempotency_keys_by_workflow
    ON idempotency_keys (workflow, created_at);

-- The keys the completer may have to finish: those still unfinished when
-- its walk passed them, with when each is next due. Small: a key that
-- finishes in time is never in it.
CREATE TABLE IF NOT EXISTS atomicphase_watch (
    id         uuid        PRIMARY KEY,
    due_at     timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    workflow   text        NOT NULL,
    definition text        NOT NULL
);

COMMENT ON TABLE atomicphase_watch IS
    'The keys the completer may have to finish: unfinished when its walk passed them. A row goes once the completer finds its key finished or gone.';
COMMENT ON COLUMN atomicphase_watch.due_at IS
    'No earlier than this the key may be due for the completer; its claim reads keys in this order, and moves it to the key''s next due time when it finds the key not due.';

CREATE INDEX IF NOT EXISTS atomicphase_watch_due
    ON atomicphase_watch (due_at);

CREATE INDEX IF NOT EXISTS atomicphase_watch_created
    ON atomicphase_watch (created_at);

-- Where the walk is. It never passes a transaction that may still commit,
-- so a key whose creating transaction commits late is walked all the same.
CREATE TABLE IF NOT EXISTS atomicphase_walk (
    walk     boolean PRIMARY KEY DEFAULT true,
    position xid8    NOT NULL,
    bound    xid8    NOT NULL
);

COMMENT ON TABLE atomicphase_walk IS
    'Where the completer''s walk of the keys is: it has passed every key created by a transaction before position, and will pass none created at or after bound, the oldest transaction running when it last moved.';

INSERT INTO atomicphase_walk (position, bound)
SELECT x, x FROM pg_snapshot_xmin(pg_current_snapshot()) AS x
ON CONFLICT DO NOTHING;

-- Operator actions, one row per key changed, written in the statement that
-- changed it, and one per action refused.
CREATE TABLE IF NOT EXISTS atomicphase_audit (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text        NOT NULL,
    action          text        NOT NULL,
    tenant          text        NOT NULL,
    idempotency_key text        NOT NULL,
    before          jsonb       NOT NULL,
    after           jsonb       NOT NULL,
    detail          jsonb       NOT NULL DEFAULT '{}',
    refused         text
);

COMMENT ON TABLE atomicphase_audit IS
    'One row per key an operator action changed (unlock, retry, resolve), written in the statement that changed it, and one per action refused.';
COMMENT ON COLUMN atomicphase_audit.actor IS
    'Who acted, as the application or the command line named them.';
COMMENT ON COLUMN atomicphase_audit.action IS
    'What was done: unlock, retry or resolve.';
COMMENT ON COLUMN atomicphase_audit.before IS
    'The key''s operator-visible fields (recovery point, hold, lease, attempts, failures, last error, resolution) before the action.';
COMMENT ON COLUMN atomicphase_audit.after IS
    'The same fields after the action.';
COMMENT ON COLUMN atomicphase_audit.detail IS
    'What the action was given: the resolution and its output, the filter of a bulk action, what the operator saw of the key.';
COMMENT ON COLUMN atomicphase_audit.refused IS
    'Why the action was refused, changing nothing (before and after are then the same): the key was no longer as the operator saw it. NULL for an action that was done.';

-- The audit of one key, newest first, for its detail page.
CREATE INDEX IF NOT EXISTS atomicphase_audit_key
    ON atomicphase_audit (tenant, idempotency_key, id);

-- The audit page's filters by actor and by action, newest first.
CREATE INDEX IF NOT EXISTS atomicphase_audit_actor
    ON atomicphase_audit (actor, id);
CREATE INDEX IF NOT EXISTS atomicphase_audit_action
    ON atomicphase_audit (action, id);

-- The unfinished keys of each workflow by status, a row set a minute,
-- recorded by the completer for the console's chart and deleted by the
-- reaper after a day. See migrations/010_status_history.up.sql.
CREATE TABLE IF NOT EXISTS atomicphase_status_history (
    minute   timestamptz NOT NULL,
    workflow text        NOT NULL,
    status   text        NOT NULL,
    keys     integer     NOT NULL,
    PRIMARY KEY (minute, workflow, status)
);

COMMENT ON TABLE atomicphase_status_history IS
    'The unfinished keys of each workflow by status, one row set a minute, recorded by the first completer pass of the minute; the reaper deletes rows older than a day.';
COMMENT ON COLUMN atomicphase_status_history.minute IS
    'The minute counted, by the database clock.';
COMMENT ON COLUMN atomicphase_status_history.workflow IS
    'The workflow whose keys were counted.';
COMMENT ON COLUMN atomicphase_status_history.status IS
    'The status counted: in_flight, waiting, stuck, unknown or dead (keyrow.Status).';
COMMENT ON COLUMN atomicphase_status_history.keys IS
    'How many of the workflow''s keys were in the status at that minute.';

-- The unfinished keys not on hold, counted every few seconds by the
-- completer for the backlog's drain rate and deleted by the reaper after
-- an hour. See migrations/015_backlog_samples.up.sql.
CREATE TABLE IF NOT EXISTS atomicphase_backlog_samples (
    slot timestamptz NOT NULL PRIMARY KEY,
    at   timestamptz NOT NULL,
    keys integer     NOT NULL
);

COMMENT ON TABLE atomicphase_backlog_samples IS
    'The unfinished keys not on hold, counted by the first completer pass of each five seconds; the reaper deletes rows older than an hour.';
COMMENT ON COLUMN atomicphase_backlog_samples.slot IS
    'The five seconds counted in, by the database clock: one count each.';
COMMENT ON COLUMN atomicphase_backlog_samples.at IS
    'When the keys were counted, by the database clock.';
COMMENT ON COLUMN atomicphase_backlog_samples.keys IS
    'How many keys were unfinished and not on hold (in flight, waiting or stuck).';

-- Raised by fenced statements when the caller's lease token no longer matches,
-- so that a pipelined COMMIT after the statement turns into a rollback.
CREATE OR REPLACE FUNCTION atomicphase_lease_lost() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'atomicphase: lease lost: the idempotency key was taken over by another run'
        USING ERRCODE = 'AP001';
END
$$;

-- The writes that commit a phase on a key table distributed with Citus:
-- each runs the UPDATE of store's distributed form and raises AP001, as the
-- fenced statements do, when it matched no row, so that the write can
-- travel with COMMIT (see migrations/011_commit_functions.up.sql).
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
    SET recovery_point = 'finished', phase_state = $3, finished_at = now(),
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

-- The same writes, which also match the recovery point the run leaves (see
-- migrations/013_commit_checks_recovery_point.up.sql); those above serve
-- the processes of earlier releases.
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
