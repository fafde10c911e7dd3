"""The HTTP API: API keys (stored hashed, with scopes and a rate) and idempotency rows.

Neither table is per recipient: a key belongs to a producer (a service), and one idempotent batch
spans many recipients. Their keys lead with the key's own id instead of user_id; on a distributed
database they are reference tables (api_keys) or distributed by api_key_id (api_idempotency).

- api_keys: `prefix` is the public half of a key (`clk_<prefix>_<secret>`), looked up on every
  request; `secret_sha256` the hash of the whole key. Revoked keys stay, with revoked_at.
- api_idempotency: one row per (API key, Idempotency-Key), written in the same transaction as the
  requests it answers for, holding that first answer until expires_at.

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"

UPGRADE = """
CREATE TABLE api_keys (
    id             bigint GENERATED ALWAYS AS IDENTITY,
    prefix         text NOT NULL,
    name           text NOT NULL,
    secret_sha256  text NOT NULL,
    scopes         text[] NOT NULL,
    rate_limit     integer NOT NULL,
    rate_window    integer NOT NULL,
    created_at     timestamptz NOT NULL,
    revoked_at     timestamptz,
    CONSTRAINT api_keys_pkey PRIMARY KEY (id),
    CONSTRAINT api_keys_prefix_key UNIQUE (prefix),
    CONSTRAINT api_keys_rate_check CHECK (rate_limit > 0 AND rate_window > 0)
);

CREATE TABLE api_idempotency (
    api_key_id     bigint NOT NULL,
    key            text NOT NULL,
    fingerprint    text NOT NULL,
    status         smallint,
    response       text,               -- the answer's body, byte for byte
    created_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    CONSTRAINT api_idempotency_pkey PRIMARY KEY (api_key_id, key),
    CONSTRAINT api_idempotency_api_key_fkey FOREIGN KEY (api_key_id) REFERENCES api_keys (id)
);
CREATE INDEX api_idempotency_expires ON api_idempotency (expires_at);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP TABLE api_idempotency; DROP TABLE api_keys;")
