-- A key records, when it is created, how long it is kept once finished
-- (phase.StoreConfig.Retention, or the client's reaper retention), so that a
-- reaper in any process deletes it only once that retention has passed, and
-- never sooner because its own configuration is shorter. Keys written
-- before this migration, and by processes of an earlier release during the
-- deploy, have none: the reaper of a process that runs their workflow keeps
-- them for its own retention, as before.
--
-- Each reaper deletes only the keys of the workflows its process runs, so
-- its scan is per workflow: the finished-keys index gains the workflow as
-- its first column. Building it holds off writes to the table while it
-- runs; on a large table, create it first by hand with CREATE INDEX
-- CONCURRENTLY and the same definition, and this migration skips it.

ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS retain_for interval;

COMMENT ON COLUMN idempotency_keys.retain_for IS
    'How long the key is kept once finished, recorded when it was created (phase.StoreConfig.Retention); no reaper deletes it sooner. NULL for keys written before retentions were recorded: the reaper of their workflow applies its own.';

CREATE INDEX IF NOT EXISTS idempotency_keys_finished_by_workflow
    ON idempotency_keys (workflow, finished_at)
    WHERE finished_at IS NOT NULL;

DROP INDEX IF EXISTS idempotency_keys_finished;
