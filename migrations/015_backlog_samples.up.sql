-- How fast a backlog drains is the fall of the unfinished keys between two
-- counts. The status history counts once a minute, too seldom for a drain
-- that lasts seconds; so the completer also counts the unfinished keys not
-- on hold every few seconds, in a table of its own, each count with the
-- time it was taken. The reaper deletes counts older than an hour. The
-- table is written by the completer alone, never on a request's path.
--
-- On a key table distributed with Citus it is a reference table, a copy on
-- every node, like the status history (migration 014); on one Postgres,
-- or on Citus before the key table is distributed, a plain table
-- (atomicphase.DistributeSQL makes it a reference table then).

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

DO $$
DECLARE
    distributed boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)
                    AND NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $2)'
            INTO distributed USING to_regclass('idempotency_keys'), to_regclass('atomicphase_backlog_samples');
    END IF;
    IF distributed THEN
        EXECUTE 'SELECT create_reference_table($1)' USING to_regclass('atomicphase_backlog_samples');
    END IF;
END
$$;
