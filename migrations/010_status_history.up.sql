-- The console draws the unfinished keys of each workflow by status over
-- time. Counting them at a past minute from the key table is impossible
-- (a key's status then is not stored) and counting them now costs a read of
-- the two partial indexes of the unfinished keys; so the completer records
-- those counts once a minute in a small table of its own, and the reaper
-- deletes its rows after a day. The table is written by the completer
-- alone, never on a request's path.
--
-- On Citus the table stays a plain table on the coordinator, and the
-- completer of a distributed key table does not write it (docs/citus.md).

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

-- The audit page filters by actor and by action, newest first.
CREATE INDEX IF NOT EXISTS atomicphase_audit_actor
    ON atomicphase_audit (actor, id);
CREATE INDEX IF NOT EXISTS atomicphase_audit_action
    ON atomicphase_audit (action, id);
