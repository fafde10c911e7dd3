"""The in-app inbox: one row per in-app delivery, and the revisions its live stream resumes from.

- inbox_items: what the in-app channel "sends". UNIQUE (user_id, delivery_id): one item per
  delivery, so a send repeated under its key (an unknown outcome, a takeover) finds the item it
  stored and adds nothing. `count` is the collapse group's size ("and counting").
- rev / created_rev: a revision from the inbox_revisions sequence, taken on insert and on every
  change; `wxid` is the writing transaction's id, so a stream can tell which lower revisions may
  still commit (see db/inbox.py, "Cursors").
- inbox_feed: the feed (newest first, not archived); inbox_unread: the unread badge;
  inbox_changes: the stream's catch-up by revision.

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.execute(
        """
CREATE SEQUENCE inbox_revisions AS bigint;
CREATE TABLE inbox_items (
    user_id text NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    delivery_id bigint NOT NULL,
    type_key text NOT NULL,
    title text NOT NULL DEFAULT '',
    body text NOT NULL DEFAULT '',
    data jsonb NOT NULL DEFAULT '{}'::jsonb,
    collapse_key text,
    count integer NOT NULL DEFAULT 1,
    rev bigint NOT NULL,
    created_rev bigint NOT NULL,
    wxid bigint NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    seen_at timestamptz,
    read_at timestamptz,
    archived_at timestamptz,
    CONSTRAINT inbox_items_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT inbox_items_delivery_key UNIQUE (user_id, delivery_id),
    CONSTRAINT inbox_items_count_check CHECK (count >= 1)
);
CREATE INDEX inbox_feed ON inbox_items (user_id, id DESC) WHERE archived_at IS NULL;
CREATE INDEX inbox_unread ON inbox_items (user_id) WHERE read_at IS NULL AND archived_at IS NULL;
CREATE INDEX inbox_changes ON inbox_items (user_id, rev);
"""
    )


def downgrade() -> None:
    op.execute("DROP TABLE inbox_items; DROP SEQUENCE inbox_revisions;")
