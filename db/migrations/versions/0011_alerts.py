"""Alerts: a channel's sends failing (send_rate_drop) and work nobody picks up (stuck_work).

One row per firing, cleared in place when the condition ends; at most one open row per
(kind, subject) — the partial unique index is what two evaluators racing each other meet.
`open_posted_at` / `clear_posted_at` record that the configured alert webhook took the firing and
the clearing, so a POST that failed is tried again at the next evaluation.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"

UPGRADE = """
CREATE TABLE alerts (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    kind             text NOT NULL,
    subject          text NOT NULL,          -- a channel, or "<requests|deliveries>:<lane>"
    opened_at        timestamptz NOT NULL,
    cleared_at       timestamptz,
    value            double precision NOT NULL,  -- the measure when it fired: failure share, seconds
    detail           text NOT NULL DEFAULT '',
    open_posted_at   timestamptz,
    clear_posted_at  timestamptz,
    CONSTRAINT alerts_pkey PRIMARY KEY (id),
    CONSTRAINT alerts_kind_check CHECK (kind IN ('send_rate_drop', 'stuck_work'))
);
CREATE UNIQUE INDEX alerts_open ON alerts (kind, subject) WHERE cleared_at IS NULL;
CREATE INDEX alerts_unposted ON alerts (id)
    WHERE open_posted_at IS NULL OR (cleared_at IS NOT NULL AND clear_posted_at IS NULL);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP TABLE alerts;")
