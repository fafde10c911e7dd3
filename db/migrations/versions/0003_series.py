"""Anchored recurring series, and the recipient's calendar (workweek, subdivision).

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"

UPGRADE = """
ALTER TABLE recipients ADD COLUMN workweek smallint[], ADD COLUMN subdivision text;

CREATE TABLE series (
    user_id          text NOT NULL REFERENCES recipients (user_id),
    id               bigint GENERATED ALWAYS AS IDENTITY,
    series_key       text NOT NULL,        -- the caller's name for it; arming twice changes nothing
    type_key         text NOT NULL,
    anchor_local     timestamp NOT NULL,   -- wall time of occurrence 0 in `zone`
    zone             text NOT NULL,
    every            text NOT NULL,        -- 1d, 2w, 1mo, 3wd
    max_count        integer,              -- at most this many occurrences
    until            timestamptz,          -- no occurrence after this
    calendar_policy  text NOT NULL,        -- skip | next_working_day | send
    variables        jsonb NOT NULL,
    state            text NOT NULL,
    next_n           integer NOT NULL DEFAULT 0,
    next_due_at      timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    CONSTRAINT series_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT series_key UNIQUE (user_id, series_key),
    CONSTRAINT series_state_check CHECK (state IN ('active', 'paused', 'ended', 'cancelled')),
    CONSTRAINT series_policy_check CHECK (calendar_policy IN ('skip', 'next_working_day', 'send')),
    CONSTRAINT series_due_when_active CHECK (state <> 'active' OR next_due_at IS NOT NULL)
);
-- The tick reads only what is due: cost grows with the number due, not the number of series.
CREATE INDEX series_due ON series (next_due_at) WHERE state = 'active';
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(
        "DROP TABLE series; ALTER TABLE recipients DROP COLUMN workweek, DROP COLUMN subdivision"
    )
