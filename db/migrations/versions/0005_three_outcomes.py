"""The third outcome of a send, leases on PostgreSQL's clock, and per-lane republish with backoff.

- deliveries.state gains `unknown`: an attempt reached the provider but its answer was lost, and
  the channel can neither be asked nor dedups by key; held for an operator. It counts as a sending
  state (it may have sent), so no second claim of the occurrence is possible while it stands.
- deliveries.send_started_at: the current attempt reached the provider call (set just before it).
- deliveries.maybe_sent_at: an earlier attempt may have sent, from this time on; NULL when nothing
  is owed. A takeover or an unknown outcome sets it; a reconciled or recorded send clears it.
- requests.rounds / deliveries.rounds: how often the tick republished a row without progress
  (exponential backoff); the due indexes lead with the lane so each lane has its own budget.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"

OLD = "('claimed', 'sent', 'delivered', 'read', 'answered')"
NEW = "('claimed', 'unknown', 'sent', 'delivered', 'read', 'answered')"
OLD_STATES = (
    "('pending', 'claimed', 'sent', 'delivered', 'read', 'answered', 'failed', 'suppressed')"
)
NEW_STATES = "('pending', 'claimed', 'unknown', 'sent', 'delivered', 'read', 'answered', 'failed', 'suppressed')"


def _ledger(sending: str, states: str, due: str) -> str:
    return f"""
ALTER TABLE deliveries DROP CONSTRAINT deliveries_state_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_state_check CHECK (state IN {states});
DROP INDEX deliveries_one_send;
DROP INDEX deliveries_one_platform;
CREATE UNIQUE INDEX deliveries_one_send ON deliveries (user_id, type_key, occurrence_key, channel)
    WHERE state IN {sending};
CREATE UNIQUE INDEX deliveries_one_platform ON deliveries (user_id, type_key, occurrence_key)
    WHERE one_platform AND state IN {sending};
DROP INDEX deliveries_due;
DROP INDEX requests_due;
CREATE INDEX deliveries_due ON deliveries ({due}) WHERE due_at IS NOT NULL;
CREATE INDEX requests_due ON requests ({due}) WHERE due_at IS NOT NULL;
"""


def upgrade() -> None:
    op.execute(
        "ALTER TABLE deliveries ADD COLUMN send_started_at timestamptz, "
        "ADD COLUMN maybe_sent_at timestamptz, ADD COLUMN rounds smallint NOT NULL DEFAULT 0; "
        "ALTER TABLE requests ADD COLUMN rounds smallint NOT NULL DEFAULT 0;"
        + _ledger(NEW, NEW_STATES, "lane, due_at")
    )


def downgrade() -> None:
    op.execute(
        "UPDATE deliveries SET state = 'failed', last_error = 'unknown outcome (downgraded)' "
        "WHERE state = 'unknown';"
        + _ledger(OLD, OLD_STATES, "due_at")
        + "ALTER TABLE deliveries DROP COLUMN send_started_at, DROP COLUMN maybe_sent_at, "
        "DROP COLUMN rounds; ALTER TABLE requests DROP COLUMN rounds;"
    )
