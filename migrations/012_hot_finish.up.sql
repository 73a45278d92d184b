-- A key's finish becomes a HOT update: it rewrites the row in its page and
-- adds no index entry, as a phase commit does. No index of the key table
-- names a column the finish changes any more: the partial indexes on
-- finished_at go, the index of keys on hold keeps last_run_at, which the
-- finish now leaves as it was, and the reaper walks keys by when they were
-- created.
--
-- The completer no longer reads an index of unfinished keys. It walks the
-- keys in the order of the transactions that created them (created_xid),
-- once each, a little behind the newest: a key still unfinished when the
-- walk passes it goes into atomicphase_watch, a small table of the keys the
-- completer may have to finish, which its claim reads in order of when
-- each is next due. The walk never passes a transaction that may still
-- commit: it stops at the oldest transaction running when its previous
-- step began (atomicphase_walk.bound), so a key whose creating transaction
-- commits late is still walked.
--
-- Keys already in the table have no created_xid; the unfinished ones go
-- into the watch here, and the walk starts after every transaction that
-- could have written them.
--
-- On a key table distributed with Citus the column has no default (Citus
-- would draw each key's xid on the coordinator, in a transaction that
-- writes nothing there) and the index of unfinished keys stays: there the
-- completer reads it, as before, and a finish is not HOT.
--
-- Building the two new indexes holds off writes to the table while it
-- runs; on a large table, create them first by hand with CREATE INDEX
-- CONCURRENTLY and the same definitions, and this migration skips them.
-- The seeding of the watch reads the unfinished keys through the index
-- this migration then drops.

ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS created_xid xid8;

COMMENT ON COLUMN idempotency_keys.created_xid IS
    'The transaction that created the key; the completer walks keys in this order, once each. NULL for keys written before it was recorded, and on a key table distributed with Citus.';
COMMENT ON COLUMN idempotency_keys.last_run_at IS
    'When a run last took the lease or gave it back unfinished; the completer waits for it to age before picking the key up, and backs off from it. A finish leaves it as it was: finished_at says when.';
COMMENT ON COLUMN idempotency_keys.finished_at IS
    'When the response was stored (NULL until then); the reaper measures retention from it. No index names it, so that storing the response is a HOT update.';

-- A hand-built index of either name that a failed concurrent build left
-- invalid would be kept by IF NOT EXISTS, and never used.
DO $$
DECLARE
    invalid text;
BEGIN
    SELECT string_agg(c.relname, ', ') INTO invalid
    FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = to_regclass('idempotency_keys') AND NOT i.indisvalid
      AND c.relname IN ('idempotency_keys_created_xid', 'idempotency_keys_by_workflow');
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'index % of idempotency_keys is invalid (a concurrent build of it failed)', invalid
            USING HINT = 'Drop it (DROP INDEX CONCURRENTLY), then build it again or let this migration build it.';
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS idempotency_keys_created_xid
    ON idempotency_keys (created_xid)
    WHERE created_xid IS NOT NULL;

CREATE INDEX IF NOT EXISTS idempotency_keys_by_workflow
    ON idempotency_keys (workflow, created_at);

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

DO $$
DECLARE
    keys        regclass := to_regclass('idempotency_keys');
    distributed boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)'
            INTO distributed USING keys;
    END IF;
    IF distributed THEN
        RETURN;
    END IF;
    ALTER TABLE idempotency_keys ALTER COLUMN created_xid SET DEFAULT pg_current_xact_id();
    INSERT INTO atomicphase_watch (id, due_at, created_at, workflow, definition)
    SELECT id, last_run_at, created_at, workflow, definition FROM idempotency_keys
    WHERE finished_at IS NULL AND created_xid IS NULL
    ON CONFLICT DO NOTHING;
    DROP INDEX IF EXISTS idempotency_keys_unfinished;
END
$$;

DROP INDEX IF EXISTS idempotency_keys_finished_by_workflow;

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
