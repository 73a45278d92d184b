-- The rides example's own tables, beside idempotency_keys.
--
-- Every table a phase writes carries the key's tenant (the rider's email)
-- and leads its primary key with it, so that on Citus (distribute.sql) it
-- is distributed by tenant, co-located with idempotency_keys, and a phase
-- stays a transaction on the one node that holds the key. On a single
-- Postgres the same keys cost what id alone would: every statement names
-- the tenant too.

CREATE TABLE IF NOT EXISTS users (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email              text NOT NULL UNIQUE,
    stripe_customer_id text NOT NULL
);

CREATE TABLE IF NOT EXISTS rides (
    tenant             text NOT NULL,
    id                 bigint GENERATED ALWAYS AS IDENTITY,
    created_at         timestamptz NOT NULL DEFAULT now(),
    idempotency_key_id uuid NOT NULL,
    user_id            bigint NOT NULL CONSTRAINT rides_user_fkey REFERENCES users (id),
    origin_lat         double precision NOT NULL,
    origin_lon         double precision NOT NULL,
    target_lat         double precision NOT NULL,
    target_lon         double precision NOT NULL,
    stripe_charge_id   text,
    PRIMARY KEY (tenant, id),
    -- One ride per idempotency key row: a safety net under the phase
    -- guarantee that ride_created commits once.
    UNIQUE (tenant, idempotency_key_id)
);

CREATE TABLE IF NOT EXISTS audit_records (
    tenant        text NOT NULL,
    id            bigint GENERATED ALWAYS AS IDENTITY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    action        text NOT NULL,
    data          jsonb NOT NULL,
    resource_id   bigint NOT NULL,
    resource_type text NOT NULL,
    user_id       bigint NOT NULL CONSTRAINT audit_records_user_fkey REFERENCES users (id),
    PRIMARY KEY (tenant, id)
);

-- A receipt "sent" by the River worker to the rider (tenant); the primary
-- key makes sending at most once per ride even when River runs a job twice.
CREATE TABLE IF NOT EXISTS receipts (
    tenant   text NOT NULL,
    ride_id  bigint NOT NULL,
    amount   bigint NOT NULL,
    sent_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, ride_id),
    FOREIGN KEY (tenant, ride_id) REFERENCES rides (tenant, id)
);
