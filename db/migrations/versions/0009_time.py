"""clarion_meta: facts about the deployment that every worker must share, starting with the tz
database. The migrating process records the tzdata release it computes with; a worker with
another release refuses to start (tasks/app.py), so no two workers compute different due times
for the same series. `clarion migrate` run from a newer install records its release: that is how
a deployment moves to new tz rules on purpose.

A small key/value table without user_id: like fatigue_counters it is not per recipient, and on a
distributed database it is a reference table (a copy on every node).

Revision ID: 0009
Revises: 0008
"""

import tzdata
from alembic import op
from sqlalchemy import text

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.execute(
        """
CREATE TABLE clarion_meta (
    key         text PRIMARY KEY,
    value       text NOT NULL,
    updated_at  timestamptz NOT NULL
);
"""
    )
    op.get_bind().execute(
        text("INSERT INTO clarion_meta (key, value, updated_at) VALUES ('tzdata', :v, now())"),
        {"v": tzdata.IANA_VERSION},
    )


def downgrade() -> None:
    op.execute("DROP TABLE clarion_meta;")
