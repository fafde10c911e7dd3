"""receipts.platform: which provider reported, when the report is the provider's own (issue 26).

A status callback from Twilio or an event from SendGrid that names a clarion delivery is proof
that the provider took the message. A delivery whose send had an unknown outcome (held as
`unknown`, or released to be resent) is settled as sent by such a report, and the sent row must
name its platform: the receipt carries it, so a report kept `early` (it beat the send's outcome)
can still settle the row when it is replayed. NULL for reports that are not a provider's (a
one-click unsubscribe).

Revision ID: 0022
Revises: 0021
"""

from alembic import op

revision = "0022"
down_revision = "0021"


def upgrade() -> None:
    op.execute("ALTER TABLE receipts ADD COLUMN platform text")


def downgrade() -> None:
    op.execute("ALTER TABLE receipts DROP COLUMN platform")
