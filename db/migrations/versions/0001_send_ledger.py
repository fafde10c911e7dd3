"""The send ledger: recipients, requests, deliveries, decisions, incidents.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None

SENDING = "('claimed', 'sent', 'delivered', 'read', 'answered')"

UPGRADE = f"""
CREATE TABLE recipients (
    user_id     text PRIMARY KEY,
    timezone    text NOT NULL,
    locale      text NOT NULL DEFAULT 'en',
    country     text,
    org_id      text,
    addresses   jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

CREATE TABLE requests (
    user_id          text NOT NULL,
    id               bigint GENERATED ALWAYS AS IDENTITY,
    type_key         text NOT NULL,
    occurrence_key   text NOT NULL,
    lane             text NOT NULL,
    template_version integer NOT NULL,
    variables        jsonb NOT NULL,
    state            text NOT NULL DEFAULT 'pending',
    due_at           timestamptz,
    created_at       timestamptz NOT NULL,
    routed_at        timestamptz,
    CONSTRAINT requests_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT requests_occurrence_key UNIQUE (user_id, type_key, occurrence_key),
    CONSTRAINT requests_user_id_fkey FOREIGN KEY (user_id) REFERENCES recipients (user_id),
    CONSTRAINT requests_state_check CHECK (state IN ('pending', 'deferred', 'routed')),
    CONSTRAINT requests_lane_check CHECK (lane IN ('transactional', 'activation'))
);
CREATE INDEX requests_due ON requests (due_at) WHERE due_at IS NOT NULL;

CREATE TABLE deliveries (
    user_id             text NOT NULL,
    id                  bigint GENERATED ALWAYS AS IDENTITY,
    request_id          bigint NOT NULL,
    type_key            text NOT NULL,
    occurrence_key      text NOT NULL,
    channel             text NOT NULL,
    one_platform        boolean NOT NULL,
    lane                text NOT NULL,
    state               text NOT NULL DEFAULT 'pending',
    claim_token         uuid,
    lease_until         timestamptz,
    not_before          timestamptz NOT NULL,
    due_at              timestamptz,
    attempts            integer NOT NULL DEFAULT 0,
    taken_over          boolean NOT NULL DEFAULT false,
    platform            text,
    provider_message_id text,
    last_error          text,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    sent_at             timestamptz,
    CONSTRAINT deliveries_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT deliveries_request_channel_key UNIQUE (user_id, request_id, channel),
    CONSTRAINT deliveries_request_fkey FOREIGN KEY (user_id, request_id)
        REFERENCES requests (user_id, id),
    CONSTRAINT deliveries_state_check CHECK (state IN
        ('pending', 'claimed', 'sent', 'delivered', 'read', 'answered', 'failed', 'suppressed')),
    -- a sent row names the platform it went out on
    CONSTRAINT deliveries_sent_names_platform CHECK (
        NOT (state IN ('sent', 'delivered', 'read', 'answered')) OR platform IS NOT NULL),
    CONSTRAINT deliveries_claim_has_token CHECK (
        state <> 'claimed' OR (claim_token IS NOT NULL AND lease_until IS NOT NULL))
);
-- Invariant 1: at most one delivery holding or having used the right to send, per occurrence and
-- channel; and for one_platform types, per occurrence across all channels.
CREATE UNIQUE INDEX deliveries_one_send ON deliveries (user_id, type_key, occurrence_key, channel)
    WHERE state IN {SENDING};
CREATE UNIQUE INDEX deliveries_one_platform ON deliveries (user_id, type_key, occurrence_key)
    WHERE one_platform AND state IN {SENDING};
CREATE INDEX deliveries_due ON deliveries (due_at) WHERE due_at IS NOT NULL;

CREATE TABLE decisions (
    user_id      text NOT NULL,
    id           bigint GENERATED ALWAYS AS IDENTITY,
    request_id   bigint NOT NULL,
    delivery_id  bigint,
    channel      text,
    gate         text NOT NULL,
    outcome      text NOT NULL,
    reason       text NOT NULL,
    detail       text NOT NULL DEFAULT '',
    decided_at   timestamptz NOT NULL,
    CONSTRAINT decisions_pkey PRIMARY KEY (user_id, id)
);
CREATE INDEX decisions_request ON decisions (user_id, request_id);

CREATE TABLE incidents (
    user_id      text NOT NULL,
    id           bigint GENERATED ALWAYS AS IDENTITY,
    delivery_id  bigint NOT NULL,
    kind         text NOT NULL,
    detail       text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL,
    CONSTRAINT incidents_pkey PRIMARY KEY (user_id, id)
);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP TABLE incidents, decisions, deliveries, requests, recipients")
