"""Escalation chains: one row per chain holding the timer of its next step, and a link per request.

`escalations` belongs to the chain's first recipient: `next_step` and `due_at` are the timer the
beat tick looks for (partial index on waiting rows); `steps` pins the chain's plan when it starts
(step type, recipient, seconds after the previous one), so a catalog edit never changes a chain in
flight. An acknowledgement, a step firing and a provider-confirmed failure are conditional updates
of this one row, so they serialise on its lock. `escalation_requests` names the chain each step's
request belongs to (step 1 is the notification itself); its key leads with the request's user_id,
which for a step sent to a second recipient is not the chain's.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"

UPGRADE = """
CREATE TABLE escalations (
    user_id        text NOT NULL,
    id             bigint GENERATED ALWAYS AS IDENTITY,
    request_id     bigint NOT NULL,           -- step 1: the notification that started the chain
    type_key       text NOT NULL,
    steps          jsonb NOT NULL,            -- [{"type", "user", "after"}] for steps 2, 3, ...
    working_hours  text,                      -- "09:00-17:00" local, on working days; NULL: all time
    next_step      smallint NOT NULL,         -- the step the timer is for (2 .. steps + 1)
    due_at         timestamptz,
    due_reason     text NOT NULL DEFAULT 'no_ack',
    due_detail     text NOT NULL DEFAULT '',
    state          text NOT NULL DEFAULT 'waiting',
    acked_at       timestamptz,
    acked_by       text,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    CONSTRAINT escalations_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT escalations_request_key UNIQUE (user_id, request_id),
    CONSTRAINT escalations_request_fkey FOREIGN KEY (user_id, request_id)
        REFERENCES requests (user_id, id),
    CONSTRAINT escalations_state_check CHECK (state IN ('waiting', 'acked', 'finished')),
    CONSTRAINT escalations_due_when_waiting CHECK (state <> 'waiting' OR due_at IS NOT NULL)
);
CREATE INDEX escalations_due ON escalations (due_at) WHERE state = 'waiting';

CREATE TABLE escalation_requests (
    user_id     text NOT NULL,
    request_id  bigint NOT NULL,
    chain_user  text NOT NULL,
    chain_id    bigint NOT NULL,
    step        smallint NOT NULL,
    CONSTRAINT escalation_requests_pkey PRIMARY KEY (user_id, request_id),
    CONSTRAINT escalation_requests_request_fkey FOREIGN KEY (user_id, request_id)
        REFERENCES requests (user_id, id)
);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP TABLE escalation_requests; DROP TABLE escalations;")
