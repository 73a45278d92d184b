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

-- One row per (API key, Idempotency-Key) whose request began executing: the
-- response it produced, replayed byte for byte to later requests with the
-- same key and the same fingerprint.
CREATE TABLE IF NOT EXISTS fakestripe_idempotency_keys (
    api_key         text        NOT NULL,
    idempotency_key text        NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint     bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    request_id      text        NOT NULL,
    status          integer     NOT NULL CHECK (status BETWEEN 100 AND 599),
    body            bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (api_key, idempotency_key)
);
