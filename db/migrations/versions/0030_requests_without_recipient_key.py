"""Drop requests_user_id_fkey: the foreign key from requests to recipients guarded nothing the
inserting statements do not, and cost every request a check and a lock.

Every statement that writes a request reads its recipient first or in the same statement: notify()
and notify_many() (db/ledger.py: the recipients' locales, UnknownRecipient for a missing one, or
the recipients' check inside the grouped INSERT), a broadcast's fan-out (its walk joins
recipients), a series' occurrences, digests, folds and snoozes (for a recipient that has a series,
a digest or a request already). And recipients are never deleted: erasure scrubs the row in place
(db/erasure.py), retention leaves it. So no request can name a recipient that is not there; what
the key added was, per request row, a lookup and a `FOR KEY SHARE` lock on the recipient's tuple
(a write to its page and a WAL record): 15% of a broadcast's fan-out rate and a large part of a
500-event batch's time in PostgreSQL (bench/RESULTS.md, "Broadcast fan-out", "HTTP ingest").

Revision ID: 0030
Revises: 0029
"""

from alembic import op

revision = "0030"
down_revision = "0029"


def upgrade() -> None:
    op.execute("ALTER TABLE requests DROP CONSTRAINT requests_user_id_fkey")


def downgrade() -> None:
    # (PostgreSQL refuses NOT VALID on a partitioned table: the whole ledger is checked here)
    op.execute(
        "ALTER TABLE requests ADD CONSTRAINT requests_user_id_fkey FOREIGN KEY (user_id) "
        "REFERENCES recipients (user_id)"
    )
