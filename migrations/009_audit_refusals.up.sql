-- Operator actions are compare-and-set on what the operator saw: an action
-- on a key that changed since is refused, and the refusal is audited like
-- an action that was done, with why it was refused.
--
-- The new column is NULL on every existing row (each of them an action
-- that was done) and has no default, so adding it rewrites nothing.

ALTER TABLE atomicphase_audit ADD COLUMN IF NOT EXISTS refused text;

COMMENT ON COLUMN atomicphase_audit.refused IS
    'Why the action was refused, changing nothing (before and after are then the same): the key was no longer as the operator saw it. NULL for an action that was done.';

COMMENT ON TABLE atomicphase_audit IS
    'One row per key an operator action changed (unlock, retry, resolve), written in the statement that changed it, and one per action refused.';

COMMENT ON COLUMN atomicphase_audit.detail IS
    'What the action was given: the resolution and its output, the filter of a bulk action, what the operator saw of the key.';
