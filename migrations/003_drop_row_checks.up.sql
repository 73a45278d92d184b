-- Migration 003: the row's invariants move from CHECK constraints into the
-- statements that write the row.
--
-- Postgres re-reads and re-plans every CHECK expression of a table on each
-- INSERT and UPDATE of one of its rows, whichever columns the statement
-- changes. On this narrow, hot row the nine constraints cost more server
-- time than the statements themselves: three times a plain UPDATE for a
-- phase's advance. The library validates every value it writes before
-- sending it (tenant, key and names by length, hold and status by value, the
-- fingerprint by its type), and each statement keeps the two row-wide rules
-- by construction: a statement that sets the lease token sets its expiry,
-- and the statements that finish a key set its recovery point, finish time
-- and response together. Dropping a constraint takes no table scan; releases
-- before this one never relied on a constraint failing.

ALTER TABLE idempotency_keys
    DROP CONSTRAINT IF EXISTS idempotency_keys_tenant_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_idempotency_key_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_workflow_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_request_fingerprint_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_recovery_point_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_hold_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_response_status_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_lease,
    DROP CONSTRAINT IF EXISTS idempotency_keys_finished;
