"""An index for the deliveries held as `unknown` (metrics and `clarion stats` count them at every
scrape; everything else open is found through deliveries_due).

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.execute(
        "CREATE INDEX deliveries_unknown ON deliveries (lane, channel) WHERE state = 'unknown'"
    )


def downgrade() -> None:
    op.execute("DROP INDEX deliveries_unknown")
