"""alerts.kind gains provider_failover: a send went to the next provider (issue 26, failover).

adapters/failover.py opens one per (channel, provider) the first time a message goes past that
provider (its connection refused, its circuit open), and clears it when the provider takes a
message again. `alerts` is not per recipient (migration 0011): one table, in either layout.

Revision ID: 0024
Revises: 0023
"""

from alembic import op

revision = "0024"
down_revision = "0023"


def _kinds(*kinds: str) -> None:
    listed = ", ".join(f"'{k}'" for k in kinds)
    op.execute("ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check")
    op.execute(f"ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check CHECK (kind IN ({listed}))")


def upgrade() -> None:
    _kinds("send_rate_drop", "stuck_work", "endpoint_disabled", "provider_failover")


def downgrade() -> None:
    op.execute("DELETE FROM alerts WHERE kind = 'provider_failover'")
    _kinds("send_rate_drop", "stuck_work", "endpoint_disabled")
