"""Audiences and broadcasts (issue 28).

- topics / topic_members: named lists that recipients join and leave (`subscribe`,
  `PUT|DELETE /v1/topics/{key}/subscribers`). A member row is per recipient (its key leads with
  user_id; partitioned by user_id in the partitioned layout); topic_members_by_topic is the
  fan-out's keyset walk over one topic in user_id order.
- broadcasts: one row per broadcast. Its recipients' requests carry the occurrence key
  `broadcast:<id>`, so requests_occurrence_key makes "no recipient requested twice" a database
  fact. `due_at` is when its fan-out next has work (NULL: none), found by the beat tick through
  broadcasts_due; planned / requested are its progress counters.
- broadcast_waves: the broadcast's fan-out in waves, each with its own due time, its zones (NULL:
  every zone; a local-time broadcast has one wave per instant its wall time comes round) and its
  keyset cursor: the last user_id requested, committed in the transaction that wrote the chunk's
  requests, so a fan-out that dies resumes right after it.
- requests_broadcast: a partial index on the occurrence keys of broadcast requests only, for a
  broadcast's progress (sent, suppressed by reason) without a scan of every request.

Revision ID: 0025
Revises: 0024
"""

from alembic import op

revision = "0025"
down_revision = "0024"

UPGRADE = """
CREATE TABLE topics (
    key         text NOT NULL,
    created_at  timestamptz NOT NULL,
    CONSTRAINT topics_pkey PRIMARY KEY (key)
);
CREATE TABLE topic_members (
    user_id     text NOT NULL,
    topic_key   text NOT NULL,
    created_at  timestamptz NOT NULL,
    CONSTRAINT topic_members_pkey PRIMARY KEY (user_id, topic_key),
    CONSTRAINT topic_members_user_id_fkey FOREIGN KEY (user_id) REFERENCES recipients (user_id),
    CONSTRAINT topic_members_topic_key_fkey FOREIGN KEY (topic_key) REFERENCES topics (key)
);
CREATE INDEX topic_members_by_topic ON topic_members (topic_key, user_id);
CREATE TABLE broadcasts (
    id                bigint GENERATED ALWAYS AS IDENTITY,
    idempotency_key   text,
    type_key          text NOT NULL,
    lane              text NOT NULL,
    template_version  integer NOT NULL,
    variables         jsonb NOT NULL,
    audience          jsonb NOT NULL,
    at_local          time,
    passed            text,
    state             text NOT NULL DEFAULT 'running',
    planned           bigint NOT NULL DEFAULT 0,
    skipped           bigint NOT NULL DEFAULT 0,
    requested         bigint NOT NULL DEFAULT 0,
    due_at            timestamptz,
    created_at        timestamptz NOT NULL,
    finished_at       timestamptz,
    CONSTRAINT broadcasts_pkey PRIMARY KEY (id),
    CONSTRAINT broadcasts_idempotency_key UNIQUE (idempotency_key),
    CONSTRAINT broadcasts_state_check CHECK (state IN ('running', 'done', 'cancelled'))
);
CREATE INDEX broadcasts_due ON broadcasts (due_at) WHERE due_at IS NOT NULL;
CREATE TABLE broadcast_waves (
    broadcast_id  bigint NOT NULL,
    wave          integer NOT NULL,
    due_at        timestamptz NOT NULL,
    zones         text[],
    cursor        text,
    planned       bigint NOT NULL DEFAULT 0,
    requested     bigint NOT NULL DEFAULT 0,
    done          boolean NOT NULL DEFAULT false,
    CONSTRAINT broadcast_waves_pkey PRIMARY KEY (broadcast_id, wave),
    CONSTRAINT broadcast_waves_broadcast_id_fkey FOREIGN KEY (broadcast_id) REFERENCES broadcasts (id)
);
CREATE INDEX requests_broadcast ON requests (occurrence_key) WHERE occurrence_key LIKE 'broadcast:%';
"""

DOWNGRADE = """
DROP INDEX requests_broadcast;
DROP TABLE broadcast_waves;
DROP TABLE broadcasts;
DROP TABLE topic_members;
DROP TABLE topics;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
