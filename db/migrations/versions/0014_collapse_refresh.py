"""Collapse in place: the updates owed to a collapse group's leading message.

One row per leader that has followers (created by the first follower, in its routing
transaction). `count` is the group's size so far, `shown` what the leader's message says; a row
with `due_at` set owes the leader's message an update from then on. Followers only lower
`due_at` (LEAST), so a storm of followers is coalesced into one update per spacing; the update
job (tasks/refresh.py) takes due rows under a lease and sets the messages to the count of that
moment. A finished row is kept a day after its window (an answer shown later re-renders the
leader with its count: db/interactions), then deleted by the job.

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"

UPGRADE = """
CREATE TABLE collapse_refreshes (
    user_id       text NOT NULL,
    leader_id     bigint NOT NULL,          -- the leading request
    collapse_key  text NOT NULL,
    count         integer NOT NULL,         -- members of the group so far, the leader included
    shown         integer NOT NULL DEFAULT 1,  -- the count the leader's message was last set to
    window_until  timestamptz NOT NULL,
    due_at        timestamptz,              -- an update is owed from then on; NULL: none
    lease_until   timestamptz,              -- an update job holds the row until then
    CONSTRAINT collapse_refreshes_pkey PRIMARY KEY (user_id, leader_id)
);
CREATE INDEX collapse_refreshes_due ON collapse_refreshes (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX collapse_refreshes_done ON collapse_refreshes (window_until) WHERE due_at IS NULL;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP TABLE collapse_refreshes;")
