"""Suppression by address and channel, for every recipient who has the address (issue 26).

suppressions.address_hash: the keyed hash of (channel, address) (clarion/hashing.py, the one an
erased recipient's row already keeps as its address), on every row, and an index on
(channel, address_hash). The gate looks rows up by the hashes of the addresses it is about to use,
whoever they were recorded for, so a bounce, complaint, STOP or dead token recorded for one user
stops the address for all. Existing rows are filled here, under the server's address secret
(CLARION_ADDRESS_SECRET, else derived from CLARION_WEBHOOK_SECRET); an erased row's address is
already its hash. The partial index of 0019 is replaced by the new one.

The table stays per recipient (its key leads with user_id; partitioned by user_id in the
partitioned layout): the cross-user lookup probes the index of every partition, measured in the
README ("Beyond one machine").

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

from clarion import hashing, settings

revision = "0021"
down_revision = "0020"


def upgrade() -> None:
    conn = op.get_bind()
    op.execute("ALTER TABLE suppressions ADD COLUMN address_hash text")
    key = hashing.address_key(settings.get())
    rows = conn.execute(
        sa.text("SELECT user_id, channel, address FROM suppressions WHERE address_hash IS NULL")
    ).all()
    fill = sa.text(
        "UPDATE suppressions SET address_hash = :h "
        "WHERE user_id = :u AND channel = :c AND address = :a"
    )
    params = [
        {
            "u": user_id,
            "c": channel,
            "a": address,
            "h": address if hashing.is_hashed(address) else hashing.hashed(key, channel, address),
        }
        for user_id, channel, address in rows
    ]
    if params:
        conn.execute(fill, params)
    op.execute(
        """
        ALTER TABLE suppressions ALTER COLUMN address_hash SET NOT NULL;
        DROP INDEX suppressions_hashed;
        CREATE INDEX suppressions_address ON suppressions (channel, address_hash);
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX suppressions_address;
        ALTER TABLE suppressions DROP COLUMN address_hash;
        CREATE INDEX suppressions_hashed ON suppressions (address) WHERE address LIKE 'hmac:%';
        """
    )
