"""Answers to chat buttons: the answer on the delivery, and every interaction (accepted or not).

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"

UPGRADE = """
ALTER TABLE deliveries ADD COLUMN answer text, ADD COLUMN answered_at timestamptz,
    ADD COLUMN answered_by text;

CREATE TABLE interactions (
    user_id        text NOT NULL,       -- as claimed by the payload ('' when it names nobody)
    id             bigint GENERATED ALWAYS AS IDENTITY,
    delivery_id    bigint,
    platform       text NOT NULL,
    platform_user  text NOT NULL,
    answer         text,
    outcome        text NOT NULL,
    reason         text NOT NULL,
    payload        text NOT NULL,       -- the raw value, cut to 1,000 characters
    created_at     timestamptz NOT NULL,
    CONSTRAINT interactions_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT interactions_outcome_check CHECK (outcome IN ('accepted', 'repeated', 'rejected'))
);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(
        "DROP TABLE interactions; ALTER TABLE deliveries DROP COLUMN answer, "
        "DROP COLUMN answered_at, DROP COLUMN answered_by"
    )
