"""Erasure (DELETE /v1/users/{id}, `clarion forget`): recipients.erased_at marks a recipient whose
personal data was removed, and suppressions of erased recipients are found by their keyed hash.

The recipient row itself stays, emptied: requests (whose unique occurrence keys make a repeated
event a no-op) reference it. An erased suppression's address becomes `hmac:<hex>` (HMAC-SHA256 of
channel and address under the server's address secret, clarion/hashing.py); the gate looks those
up by the hashes of the addresses it is about to use, through the partial index added here.

Revision ID: 0019
Revises: 0018
"""

from alembic import op

revision = "0019"
down_revision = "0018"

UPGRADE = """
ALTER TABLE recipients ADD COLUMN erased_at timestamptz;
CREATE INDEX suppressions_hashed ON suppressions (address) WHERE address LIKE 'hmac:%';
"""

DOWNGRADE = """
DROP INDEX suppressions_hashed;
ALTER TABLE recipients DROP COLUMN erased_at;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
