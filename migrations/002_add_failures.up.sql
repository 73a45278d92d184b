-- The completer's own failures, counted apart from client retries, so that a
-- key a client keeps retrying through an outage is never given up on.

ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS failures integer NOT NULL DEFAULT 0;

COMMENT ON COLUMN idempotency_keys.hold IS
    'Why an unfinished key must not run: unknown (a foreign call''s outcome awaits reconciliation) or dead (the completer gave up on it while no client was retrying). NULL means runnable.';
COMMENT ON COLUMN idempotency_keys.attempts IS
    'How many runs took the lease, by clients and by the completer.';
COMMENT ON COLUMN idempotency_keys.failures IS
    'Failed runs of the completer since the key last made progress; client retries do not count. Drives the completer''s backoff, and the move to dead of an idle key.';
