-- A key remembers the definition of its workflow that it started under, so
-- that only a process that runs that definition (or one declared to adopt
-- it) resumes the key; and which non-repeatable foreign call may be in
-- flight, so that a run after a crash reconciles it instead of sending it
-- again. Both columns are added without rewriting the table: keys in flight
-- keep running. Keys written before this migration have an empty
-- definition and fingerprints of the first kind (see keyrow.Fingerprint).

ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS definition text NOT NULL DEFAULT '';
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS call_pending text;

COMMENT ON COLUMN idempotency_keys.definition IS
    'Identity of the workflow definition the key started under (phase.Workflow.Definition); only a process that registered it, or adopts it, resumes the key. Empty for keys written before definitions were recorded.';
COMMENT ON COLUMN idempotency_keys.call_pending IS
    'The phase whose foreign call, not safe to repeat, was about to be sent when this was written; cleared when the phase commits or the call fails for sure. A run that finds it set reconciles the call instead of sending it again.';
COMMENT ON COLUMN idempotency_keys.request_fingerprint IS
    'SHA-256 of the request as the client sent it (its target and canonical body); a retry with another payload is refused instead of replayed. Keys with an empty definition hold the earlier fingerprint, of the workflow name and the re-encoded request.';
