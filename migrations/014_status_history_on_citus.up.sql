-- On a key table distributed with Citus the status history becomes a
-- reference table, a copy of it on every node: the completer of a process
-- connected to the coordinator or to a worker records each minute's counts
-- there, the reaper trims them, and the console and `atomicphase counts`
-- draw the history and the backlog's drain rate as on one Postgres. The
-- table holds a day of minutes, a few rows each, so copying it is quick.
--
-- On one Postgres it changes nothing, nor on Citus before the key table
-- is distributed: atomicphase.DistributeSQL makes the table a reference
-- table then.

DO $$
DECLARE
    distributed boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)
                    AND NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $2)'
            INTO distributed USING to_regclass('idempotency_keys'), to_regclass('atomicphase_status_history');
    END IF;
    IF distributed THEN
        EXECUTE 'SELECT create_reference_table($1)' USING to_regclass('atomicphase_status_history');
    END IF;
END
$$;
