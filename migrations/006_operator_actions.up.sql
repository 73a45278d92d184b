-- Operator actions: an operator's word on an unknown outcome, kept on the
-- key until its run acts on it, and the audit trail of every action.
--
-- The new column is NULL on every existing row and has no default, so
-- adding it rewrites nothing and takes no table scan. The audit table is
-- written only by operator actions, never on a request's path.

ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS resolution jsonb;

COMMENT ON COLUMN idempotency_keys.resolution IS
    'An operator''s resolution of an unknown outcome, for the phase after the recovery point it names: happened (with the call''s output) or not happened. The next run takes it (and clears it) instead of calling the phase''s reconcile function. NULL almost always.';

CREATE TABLE IF NOT EXISTS atomicphase_audit (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text        NOT NULL,
    action          text        NOT NULL,
    tenant          text        NOT NULL,
    idempotency_key text        NOT NULL,
    before          jsonb       NOT NULL,
    after           jsonb       NOT NULL,
    detail          jsonb       NOT NULL DEFAULT '{}'
);

COMMENT ON TABLE atomicphase_audit IS
    'One row per key an operator action changed (unlock, retry, resolve), written in the statement that changed it.';
COMMENT ON COLUMN atomicphase_audit.actor IS
    'Who acted, as the application or the command line named them.';
COMMENT ON COLUMN atomicphase_audit.action IS
    'What was done: unlock, retry or resolve.';
COMMENT ON COLUMN atomicphase_audit.before IS
    'The key''s operator-visible fields (recovery point, hold, lease, attempts, failures, last error, resolution) before the action.';
COMMENT ON COLUMN atomicphase_audit.after IS
    'The same fields after the action.';
COMMENT ON COLUMN atomicphase_audit.detail IS
    'What the action was given: the resolution and its output, the filter of a bulk action.';

-- The audit of one key, newest first, for its detail page.
CREATE INDEX IF NOT EXISTS atomicphase_audit_key
    ON atomicphase_audit (tenant, idempotency_key, id);
