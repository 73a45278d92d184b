-- ledger schema. Safe to apply more than once: every statement is
-- idempotent, and Migrate serialises concurrent runs with an advisory lock.

-- An account holds money in one currency, in three buckets: balance (free to
-- spend), held (reserved by its transfers in flight) and paid_out (sent out
-- of the ledger by its external transfers, cumulative). Every bucket is the
-- sum of the account's entries in it. Money comes into the ledger from the
-- currency's one funding account, whose balance is minus everything ever
-- deposited.
CREATE TABLE IF NOT EXISTS ledger_accounts (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       text        NOT NULL DEFAULT 'customer' CHECK (kind IN ('customer', 'funding')),
    owner      text        CHECK (char_length(owner) BETWEEN 1 AND 255),
    currency   text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    balance    bigint      NOT NULL DEFAULT 0,
    held       bigint      NOT NULL DEFAULT 0 CHECK (held >= 0),
    paid_out   bigint      NOT NULL DEFAULT 0 CHECK (paid_out >= 0),
    created_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT ledger_accounts_owner CHECK ((kind = 'customer') = (owner IS NOT NULL)),
    -- The last line of defence: a transfer checks the balance under the
    -- account's row lock before it moves anything.
    CONSTRAINT ledger_accounts_no_overdraft CHECK (kind = 'funding' OR balance >= 0)
);

CREATE INDEX IF NOT EXISTS ledger_accounts_owner_idx ON ledger_accounts (owner, id);

CREATE UNIQUE INDEX IF NOT EXISTS ledger_accounts_funding
    ON ledger_accounts (currency) WHERE kind = 'funding';

-- A transfer, from the moment its funds are held. Its status follows its
-- phases: held, payout_sent (external transfers only), then settled; or
-- payout_failed when the payout provider refused the money and the hold went
-- back to the balance.
CREATE TABLE IF NOT EXISTS ledger_transfers (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner              text        NOT NULL,
    -- The request's key, and the id of its idempotency_keys row.
    idempotency_key    text        NOT NULL,
    key_id             uuid        NOT NULL,
    from_account       bigint      NOT NULL REFERENCES ledger_accounts,
    to_account         bigint      REFERENCES ledger_accounts,
    payout_destination text,
    amount             bigint      NOT NULL CHECK (amount > 0),
    currency           text        NOT NULL,
    status             text        NOT NULL DEFAULT 'held'
                                   CHECK (status IN ('held', 'payout_sent', 'settled', 'payout_failed')),
    payout_id          text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz,

    -- The idempotency key already makes the phase that inserts a transfer
    -- commit once; this makes a second commit fail loudly instead of
    -- holding the money twice. It names the key row, not the key: once the
    -- reaper has deleted a finished key, the client may use the key again
    -- for a new transfer.
    CONSTRAINT ledger_transfers_key_id UNIQUE (key_id),
    CONSTRAINT ledger_transfers_one_destination CHECK ((to_account IS NULL) <> (payout_destination IS NULL))
);

CREATE INDEX IF NOT EXISTS ledger_transfers_owner_key ON ledger_transfers (owner, idempotency_key);

CREATE SEQUENCE IF NOT EXISTS ledger_movement_seq;

-- Double entry: every movement of money is two entries, one taking the
-- amount out of an account's bucket and one putting it into another, with
-- the same movement number; a movement's entries sum to zero.
CREATE TABLE IF NOT EXISTS ledger_entries (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    movement    bigint      NOT NULL,
    -- NULL for deposits, which belong to no transfer.
    transfer_id bigint      REFERENCES ledger_transfers,
    account_id  bigint      NOT NULL REFERENCES ledger_accounts,
    bucket      text        NOT NULL CHECK (bucket IN ('balance', 'held', 'paid_out')),
    amount      bigint      NOT NULL CHECK (amount <> 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS ledger_entries_movement ON ledger_entries (movement);
CREATE INDEX IF NOT EXISTS ledger_entries_account ON ledger_entries (account_id);
CREATE INDEX IF NOT EXISTS ledger_entries_transfer ON ledger_entries (transfer_id);
