-- payoutprovider schema. Safe to apply more than once: every statement is
-- idempotent, and Migrate serialises concurrent runs with an advisory lock.
-- The tables are prefixed so that the fake provider can share a database
-- with the service that calls it.

CREATE TABLE IF NOT EXISTS payoutprovider_payouts (
    -- seq orders payouts as they were made.
    seq             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              text        NOT NULL UNIQUE,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL,
    destination     text        NOT NULL,
    -- The caller's own reference, such as its transfer id.
    reference       text        NOT NULL DEFAULT '',
    status          text        NOT NULL CHECK (status IN ('paid', 'failed')),
    failure_code    text        NOT NULL DEFAULT '',
    idempotency_key text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS payoutprovider_payouts_reference
    ON payoutprovider_payouts (reference);

-- payoutprovider_idempotency_keys comes from fakeapi.KeysSchema, which
-- Schema appends.
