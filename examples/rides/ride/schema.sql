-- The rides example's own tables, beside idempotency_keys.

CREATE TABLE IF NOT EXISTS users (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email              text NOT NULL UNIQUE,
    stripe_customer_id text NOT NULL
);

CREATE TABLE IF NOT EXISTS rides (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- One ride per idempotency key row: a safety net under the phase
    -- guarantee that ride_created commits once.
    idempotency_key_id uuid NOT NULL UNIQUE,
    user_id            bigint NOT NULL REFERENCES users (id),
    origin_lat         double precision NOT NULL,
    origin_lon         double precision NOT NULL,
    target_lat         double precision NOT NULL,
    target_lon         double precision NOT NULL,
    stripe_charge_id   text
);

CREATE TABLE IF NOT EXISTS audit_records (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    action        text NOT NULL,
    data          jsonb NOT NULL,
    resource_id   bigint NOT NULL,
    resource_type text NOT NULL,
    user_id       bigint NOT NULL REFERENCES users (id)
);

-- A receipt "sent" by the River worker; the primary key makes sending at
-- most once per ride even when River runs a job twice.
CREATE TABLE IF NOT EXISTS receipts (
    ride_id  bigint PRIMARY KEY REFERENCES rides (id),
    email    text NOT NULL,
    amount   bigint NOT NULL,
    sent_at  timestamptz NOT NULL DEFAULT now()
);
