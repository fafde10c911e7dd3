"""Operator commands: lifted suppressions are audited; API keys get a last-used time and an expiry.

- suppression_lifts: one row per suppression an operator lifted (`clarion suppressions lift`): the
  entry as it was (channel, address, reason, detail, when it was listed) and who lifted it, when
  and why. It is an audit log, not a per-recipient table: user_id is nullable so that a
  suppression kept per address for everyone (issue 26) fits without a change.
- api_keys.last_used_at: written at most once a minute per key (a conditional UPDATE), never once
  per request. api_keys.expires_at: optional; past it the key is refused (401) like a revoked one.

Revision ID: 0020
Revises: 0019
"""

from alembic import op

revision = "0020"
down_revision = "0019"

UPGRADE = """
CREATE TABLE suppression_lifts (
    id             bigint GENERATED ALWAYS AS IDENTITY,
    user_id        text,
    channel        text NOT NULL,
    address        text NOT NULL,
    reason         text NOT NULL,
    detail         text NOT NULL DEFAULT '',
    suppressed_at  timestamptz NOT NULL,
    lifted_by      text NOT NULL,
    lifted_at      timestamptz NOT NULL,
    why            text NOT NULL,
    CONSTRAINT suppression_lifts_pkey PRIMARY KEY (id)
);
CREATE INDEX suppression_lifts_address ON suppression_lifts (channel, address);
ALTER TABLE api_keys ADD COLUMN last_used_at timestamptz, ADD COLUMN expires_at timestamptz;
"""

DOWNGRADE = """
ALTER TABLE api_keys DROP COLUMN last_used_at, DROP COLUMN expires_at;
DROP TABLE suppression_lifts;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
