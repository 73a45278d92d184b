-- fakestripe schema. Safe to apply more than once: every statement is
-- idempotent, and Migrate serialises concurrent runs with an advisory lock.

CREATE TABLE IF NOT EXISTS fakestripe_charges (
    -- seq orders charges for lists: created has one-second resolution, and
    -- Stripe lists newest first with a total order that cursors rely on.
    seq             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              text        NOT NULL UNIQUE,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL,
    customer        text        NOT NULL,
    description     text        NOT NULL DEFAULT '',
    metadata        jsonb       NOT NULL DEFAULT '{}',
    -- Empty when the request carried no Idempotency-Key.
    idempotency_key text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS fakestripe_charges_customer_seq
    ON fakestripe_charges (customer, seq);

-- fakestripe_idempotency_keys comes from fakeapi.KeysSchema, which Schema
-- appends.
