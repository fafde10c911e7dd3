"""Digests: the buffer a digested type's requests join until their digest is flushed.

One row per (recipient, digest type, digest key, window). At most one row per (user_id,
digest_type, digest_key) is `open` (the partial unique index items meet when they race to open a
window); reaching max_items turns it `full` (no longer open, so the next item opens the next
window); the route of its digest request closes it (`closed`) by a conditional update and takes its
items. `request_id` is that digest request, created with the window, deferred until `due_at`.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"

UPGRADE = """
CREATE TABLE digests (
    user_id      text NOT NULL,
    id           bigint GENERATED ALWAYS AS IDENTITY,
    digest_type  text NOT NULL,
    digest_key   text NOT NULL,
    state        text NOT NULL,
    opened_at    timestamptz NOT NULL,
    due_at       timestamptz NOT NULL,
    closed_at    timestamptz,
    max_items    integer NOT NULL,
    count        integer NOT NULL,
    items        jsonb NOT NULL,
    request_id   bigint,
    CONSTRAINT digests_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT digests_state_check CHECK (state IN ('open', 'full', 'closed'))
);
CREATE UNIQUE INDEX digests_open ON digests (user_id, digest_type, digest_key)
    WHERE state = 'open';
CREATE INDEX digests_request ON digests (user_id, request_id);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP TABLE digests;")
