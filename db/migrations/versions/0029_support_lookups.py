"""The activity page's searches by request id and by event id, without a user id, by index
(issue 29, bench/history.py).

Both read requests whole before this: every key of requests leads with user_id, so `WHERE id = …`
and `WHERE occurrence_key = …` without the recipient were a sequential scan of the ledger, a few
milliseconds on a fresh one and seconds at tens of millions of rows, on a support page.

- requests_id: a btree on requests (id) (the id is unique by its identity; not declared unique,
  which a table partitioned by user_id cannot hold without user_id).
- requests_event: a hash index on requests (occurrence_key): the search asks only for equality,
  and a hash index holds a 4-byte hash per row where a btree would hold the whole key
  ("event:" and the app's id, often a UUID), about half the size on the hottest table.

Each is one more index entry per request routed. On an existing large ledger the CREATE INDEX
holds writes to requests for as long as it builds: build them beforehand with CREATE INDEX
CONCURRENTLY under these names (then this revision finds them and does nothing).

Revision ID: 0029
Revises: 0028
"""

from alembic import op

revision = "0029"
down_revision = "0028"


def upgrade() -> None:
    op.execute("CREATE INDEX IF NOT EXISTS requests_id ON requests (id)")
    op.execute("CREATE INDEX IF NOT EXISTS requests_event ON requests USING hash (occurrence_key)")


def downgrade() -> None:
    op.execute("DROP INDEX requests_event")
    op.execute("DROP INDEX requests_id")
