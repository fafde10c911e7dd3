"""Drop requests_broadcast: 0028's requests_occurrence indexes every request's occurrence key, a
broadcast's `broadcast:<id>` among them, so the partial index of 0025 answered nothing the other
could not (and the planner never chose it: a broadcast's progress asks `occurrence_key = :occ`,
from which PostgreSQL cannot prove the index's `LIKE 'broadcast:%'`). It cost every broadcast
request one more index entry on the fan-out's path (bench/broadcast.py).

Revision ID: 0029
Revises: 0028
"""

from alembic import op

revision = "0029"
down_revision = "0028"


def upgrade() -> None:
    op.execute("DROP INDEX requests_broadcast")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX requests_broadcast ON requests (occurrence_key) "
        "WHERE occurrence_key LIKE 'broadcast:%'"
    )
