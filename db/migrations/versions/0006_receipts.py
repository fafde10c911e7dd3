"""Receipts: what providers report after a send, and the delivery states they move a row through.

- deliveries.state gains `opened`, `clicked` (after `delivered`), `bounced` (hard bounce) and
  `undelivered` (the provider gave up after taking it: SMS undelivered/failed). All four have used
  the right to send, so they are sending states: nothing sends the occurrence again.
- receipts: every report, applied or not (`outcome`: applied, repeated, stale, early,
  unknown_message, mismatch), with the provider's message id, event and detail. `early` receipts
  arrived before the send was recorded; the tick applies them once it is.
- deliveries_provider_message: receipts name the message by the provider's id.
- recipients_sms: inbound STOP/START find recipients by their SMS number.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"

OLD_SENDING = "('claimed', 'unknown', 'sent', 'delivered', 'read', 'answered')"
NEW_SENDING = (
    "('claimed', 'unknown', 'sent', 'delivered', 'opened', 'read', 'clicked', 'answered', "
    "'bounced', 'undelivered')"
)
OLD_STATES = (
    "('pending', 'claimed', 'unknown', 'sent', 'delivered', 'read', 'answered', 'failed', "
    "'suppressed')"
)
NEW_STATES = (
    "('pending', 'claimed', 'unknown', 'sent', 'delivered', 'opened', 'read', 'clicked', "
    "'answered', 'bounced', 'undelivered', 'failed', 'suppressed')"
)
OLD_SENT = "('sent', 'delivered', 'read', 'answered')"
NEW_SENT = (
    "('sent', 'delivered', 'opened', 'read', 'clicked', 'answered', 'bounced', 'undelivered')"
)


def _states(states: str, sending: str, sent: str) -> str:
    return f"""
ALTER TABLE deliveries DROP CONSTRAINT deliveries_state_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_state_check CHECK (state IN {states});
ALTER TABLE deliveries DROP CONSTRAINT deliveries_sent_names_platform;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_sent_names_platform
    CHECK (NOT (state IN {sent}) OR platform IS NOT NULL);
DROP INDEX deliveries_one_send;
DROP INDEX deliveries_one_platform;
CREATE UNIQUE INDEX deliveries_one_send ON deliveries (user_id, type_key, occurrence_key, channel)
    WHERE state IN {sending};
CREATE UNIQUE INDEX deliveries_one_platform ON deliveries (user_id, type_key, occurrence_key)
    WHERE one_platform AND state IN {sending};
"""


def upgrade() -> None:
    op.execute(
        _states(NEW_STATES, NEW_SENDING, NEW_SENT)
        + """
CREATE INDEX deliveries_provider_message ON deliveries (provider_message_id)
    WHERE provider_message_id IS NOT NULL;
CREATE INDEX recipients_sms ON recipients ((addresses ->> 'sms'))
    WHERE addresses ? 'sms';
CREATE TABLE receipts (
    user_id text NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    delivery_id bigint,
    channel text NOT NULL,
    event text NOT NULL,
    provider_message_id text,
    address text,
    event_id text,
    detail text NOT NULL DEFAULT '',
    outcome text NOT NULL,
    occurred_at timestamptz NOT NULL,
    received_at timestamptz NOT NULL,
    CONSTRAINT receipts_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT receipts_outcome_check CHECK (outcome IN
        ('applied', 'repeated', 'stale', 'early', 'unknown_message', 'mismatch'))
);
CREATE INDEX receipts_delivery ON receipts (user_id, delivery_id);
CREATE INDEX receipts_early ON receipts (received_at) WHERE outcome = 'early';
"""
    )


def downgrade() -> None:
    op.execute(
        "DROP TABLE receipts; DROP INDEX recipients_sms; DROP INDEX deliveries_provider_message;"
        "UPDATE deliveries SET state = 'delivered' WHERE state IN ('opened', 'clicked');"
        "UPDATE deliveries SET state = 'failed', last_error = 'bounced (downgraded)' "
        "WHERE state IN ('bounced', 'undelivered');" + _states(OLD_STATES, OLD_SENDING, OLD_SENT)
    )
