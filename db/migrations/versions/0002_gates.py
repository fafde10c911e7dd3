"""Gates: quiet hours on recipients, preferences, the suppression list, activation windows,
fatigue caps and collapse groups.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"

UPGRADE = """
ALTER TABLE recipients ADD COLUMN quiet_start time, ADD COLUMN quiet_end time;

CREATE TABLE preferences (
    user_id     text NOT NULL REFERENCES recipients (user_id),
    scope       text NOT NULL,          -- 'type' | 'category' | 'all'
    key         text NOT NULL,          -- type key, category, or '*'
    channel     text NOT NULL,          -- a channel, or '*' for every channel
    enabled     boolean NOT NULL,
    updated_at  timestamptz NOT NULL,
    CONSTRAINT preferences_pkey PRIMARY KEY (user_id, scope, key, channel),
    CONSTRAINT preferences_scope_check CHECK (scope IN ('type', 'category', 'all'))
);

CREATE TABLE suppressions (
    user_id     text NOT NULL,
    channel     text NOT NULL,
    address     text NOT NULL,
    reason      text NOT NULL,          -- bounced | complained | stop | deactivated | ...
    detail      text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    CONSTRAINT suppressions_pkey PRIMARY KEY (user_id, channel, address)
);

-- At most one activation nudge per recipient per window; claimed by a conditional upsert.
CREATE TABLE activation_windows (
    user_id     text PRIMARY KEY,
    request_id  bigint NOT NULL,
    type_key    text NOT NULL,
    opened_at   timestamptz NOT NULL,
    until       timestamptz NOT NULL
);

-- Fatigue counters per scope ('user:<id>' per local day, 'org:<id>' per hour) and bucket.
CREATE TABLE fatigue_counters (
    scope       text NOT NULL,
    bucket      text NOT NULL,
    count       integer NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT fatigue_counters_pkey PRIMARY KEY (scope, bucket)
);

CREATE TABLE collapse_groups (
    user_id       text NOT NULL,
    collapse_key  text NOT NULL,
    leader_id     bigint NOT NULL,
    window_until  timestamptz NOT NULL,
    count         integer NOT NULL,
    CONSTRAINT collapse_groups_pkey PRIMARY KEY (user_id, collapse_key)
);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(
        "DROP TABLE collapse_groups, fatigue_counters, activation_windows, suppressions, preferences;"
        "ALTER TABLE recipients DROP COLUMN quiet_start, DROP COLUMN quiet_end"
    )
