"""Outbound events (issue 25): apps' webhook endpoints, and an outbox written by triggers.

DESIGN invariant 12: no state change without its outbound event, no event without its change. The
changes happen in many db/ modules (routing, claims, the group commit of "sent", receipts,
incidents, preferences, the inbox), so the events are written by PostgreSQL itself: one
statement-level AFTER trigger per (table, operation), with its transition table (`REFERENCING NEW
TABLE`), so a statement that changes 500 rows makes one trigger call and one INSERT … SELECT, in the
statement's own transaction. A rolled-back change leaves no event; a committed one has its event,
whichever code path (or psql session) made it.

Each trigger function starts with one cheap check, "does any endpoint want these kinds?" (a
sequential scan of `webhook_endpoints`, a handful of rows); with none, it returns before reading
its transition table, and it writes only the kinds some endpoint wants. Endpoints that are disabled still count: their events wait, so that
re-enabling one (or `clarion events replay --since`) delivers what it missed.

- webhook_endpoints: URL, the kinds wanted, the Standard Webhooks secret (`whsec_` + base64) and
  the previous one with the end of its overlap, enabled or not (and why), since when it fails.
- outbound_events: one row per event: its sequence (`id`, an identity: ordered per delivery, since
  a delivery's changes are serialised by its row lock and the event is written before the commit),
  kind, the ids the app knows, the stream it is ordered in (`d:<user>:<delivery>`, else
  `r:<user>:<request>`, else `u:<user>`) and its data. Not partitioned: it is the queue the
  dispatcher reads by endpoint, not a per-recipient ledger (a row is small and pruned by retention).
- outbound_sends: one row per (endpoint, event), written by a trigger on outbound_events: pending
  until the endpoint answers 2xx, with attempts, the next attempt's time and a lease. A new send
  is due at '-infinity' (at once, whatever clock the dispatcher is given: tests inject theirs).

Triggers are recreated on the partitioned layout by db/partitioning.py (statement-level triggers
with transition tables are allowed on a partitioned table; they see the rows of every partition).
Each function pins `search_path FROM CURRENT` (as 0018 does): a host app's connection under
notify(connection=...) still writes clarion's outbox.

Revision ID: 0023
Revises: 0022
"""

from alembic import op

revision = "0023"
down_revision = "0022"

DELIVERY_KINDS = (
    "sent",
    "delivered",
    "opened",
    "read",
    "clicked",
    "answered",
    "bounced",
    "undelivered",
    "failed",
    "unknown",
    "suppressed",
)
KINDS = (
    "request.accepted",
    "gate.stopped",
    *(f"delivery.{s}" for s in DELIVERY_KINDS),
    "incident.recorded",
    "preference.changed",
    "inbox.read",
)


def _array(values: tuple[str, ...]) -> str:
    return "ARRAY[" + ", ".join(f"'{v}'" for v in values) + "]::text[]"


_DELIVERY_STATES = ", ".join(f"'{s}'" for s in DELIVERY_KINDS)

TABLES = f"""
CREATE TABLE webhook_endpoints (
    id                bigint GENERATED ALWAYS AS IDENTITY,
    url               text NOT NULL,
    kinds             text[] NOT NULL,
    description       text NOT NULL DEFAULT '',
    secret            text NOT NULL,
    previous_secret   text,
    previous_until    timestamptz,
    enabled           boolean NOT NULL DEFAULT true,
    disabled_reason   text NOT NULL DEFAULT '',
    failing_since     timestamptz,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    CONSTRAINT webhook_endpoints_pkey PRIMARY KEY (id),
    CONSTRAINT webhook_endpoints_kinds_check
        CHECK (cardinality(kinds) > 0 AND kinds <@ {_array(KINDS)})
);
CREATE TABLE outbound_events (
    user_id         text NOT NULL,
    id              bigint GENERATED ALWAYS AS IDENTITY,
    kind            text NOT NULL,
    stream          text NOT NULL,
    request_id      bigint,
    delivery_id     bigint,
    channel         text,
    type_key        text,
    occurrence_key  text,
    data            jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbound_events_pkey PRIMARY KEY (user_id, id)
);
CREATE INDEX outbound_events_created ON outbound_events (created_at);
CREATE INDEX outbound_events_request ON outbound_events (user_id, request_id);
CREATE TABLE outbound_sends (
    endpoint_id   bigint NOT NULL,
    event_id      bigint NOT NULL,
    user_id       text NOT NULL,
    stream        text NOT NULL,
    state         text NOT NULL DEFAULT 'pending',
    attempts      integer NOT NULL DEFAULT 0,
    next_at       timestamptz NOT NULL,
    lease_until   timestamptz,
    last_error    text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL,
    delivered_at  timestamptz,
    CONSTRAINT outbound_sends_pkey PRIMARY KEY (endpoint_id, event_id),
    CONSTRAINT outbound_sends_endpoint_fkey FOREIGN KEY (endpoint_id)
        REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    CONSTRAINT outbound_sends_state_check CHECK (state IN ('pending', 'delivered'))
);
CREATE INDEX outbound_sends_ready ON outbound_sends (endpoint_id, next_at)
    WHERE state = 'pending';
CREATE INDEX outbound_sends_stream ON outbound_sends (endpoint_id, stream, event_id)
    WHERE state = 'pending';
CREATE INDEX outbound_sends_created ON outbound_sends (endpoint_id, created_at);
ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check
    CHECK (kind IN ('send_rate_drop', 'stuck_work', 'endpoint_disabled'));
"""


def _function(name: str, kinds: tuple[str, ...], body: str) -> str:
    """A trigger function that returns at once unless some endpoint wants one of `kinds`;
    `wanted` (every kind some endpoint wants) is there for the body to write only those."""
    return f"""
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    wanted text[];
BEGIN
    SELECT array_agg(DISTINCT k) INTO wanted FROM webhook_endpoints, unnest(kinds) k;
    IF wanted IS NULL OR NOT wanted && {_array(kinds)} THEN
        RETURN NULL;
    END IF;
    {body}
    RETURN NULL;
END $$;
"""


_INSERT = (
    "INSERT INTO outbound_events (user_id, kind, stream, request_id, delivery_id, channel, "
    "type_key, occurrence_key, data)"
)
# The app's own event id: what notify(event_id=…) was given (the occurrence key `event:<id>`).
_EVENT_ID = "CASE WHEN {o} LIKE 'event:%' THEN substr({o}, 7) END"

FUNCTIONS = "".join(
    [
        _function(
            "outbound_requests",
            ("request.accepted",),
            f"""{_INSERT}
    SELECT n.user_id, 'request.accepted', 'r:' || n.user_id || ':' || n.id, n.id, NULL, NULL,
        n.type_key, n.occurrence_key,
        jsonb_build_object('event_id', {_EVENT_ID.format(o="n.occurrence_key")}, 'lane', n.lane,
            'state', n.state, 'due_at', n.due_at, 'at', n.created_at)
    FROM new_rows n ORDER BY n.user_id, n.id;""",
        ),
        _function(
            "outbound_decisions",
            ("gate.stopped",),
            f"""{_INSERT}
    SELECT n.user_id, 'gate.stopped',
        CASE WHEN n.delivery_id IS NULL THEN 'r:' || n.user_id || ':' || n.request_id
             ELSE 'd:' || n.user_id || ':' || n.delivery_id END,
        n.request_id, n.delivery_id, n.channel, r.type_key, r.occurrence_key,
        jsonb_build_object('event_id', {_EVENT_ID.format(o="r.occurrence_key")}, 'gate', n.gate,
            'outcome', n.outcome, 'reason', n.reason, 'detail', n.detail, 'at', n.decided_at)
    FROM new_rows n LEFT JOIN requests r ON r.user_id = n.user_id AND r.id = n.request_id
    WHERE n.outcome <> 'allow' ORDER BY n.user_id, n.id;""",
        ),
        _function(
            "outbound_deliveries",
            tuple(f"delivery.{s}" for s in DELIVERY_KINDS),
            f"""IF TG_OP = 'INSERT' THEN
        {_INSERT}
        SELECT n.user_id, 'delivery.' || n.state, 'd:' || n.user_id || ':' || n.id, n.request_id,
            n.id, n.channel, n.type_key, n.occurrence_key,
            jsonb_build_object('event_id', {_EVENT_ID.format(o="n.occurrence_key")},
                'state', n.state, 'platform', n.platform, 'error', n.last_error,
                'at', n.updated_at)
        FROM new_rows n
        WHERE n.state IN ({_DELIVERY_STATES}) AND 'delivery.' || n.state = ANY(wanted)
        ORDER BY n.user_id, n.id;
    ELSE
        {_INSERT}
        SELECT n.user_id, 'delivery.' || n.state, 'd:' || n.user_id || ':' || n.id, n.request_id,
            n.id, n.channel, n.type_key, n.occurrence_key,
            jsonb_build_object('event_id', {_EVENT_ID.format(o="n.occurrence_key")},
                'state', n.state, 'previous_state', o.state, 'platform', n.platform,
                'error', n.last_error, 'at', n.updated_at)
        FROM new_rows n JOIN old_rows o ON o.user_id = n.user_id AND o.id = n.id
        WHERE n.state IS DISTINCT FROM o.state AND n.state IN ({_DELIVERY_STATES})
          AND 'delivery.' || n.state = ANY(wanted)
        ORDER BY n.user_id, n.id;
    END IF;""",
        ),
        _function(
            "outbound_incidents",
            ("incident.recorded",),
            f"""{_INSERT}
    SELECT n.user_id, 'incident.recorded', 'd:' || n.user_id || ':' || n.delivery_id,
        d.request_id, n.delivery_id, d.channel, d.type_key, d.occurrence_key,
        jsonb_build_object('event_id', {_EVENT_ID.format(o="d.occurrence_key")},
            'incident', n.kind, 'detail', n.detail, 'at', n.created_at)
    FROM new_rows n LEFT JOIN deliveries d ON d.user_id = n.user_id AND d.id = n.delivery_id
    ORDER BY n.user_id, n.id;""",
        ),
        _function(
            "outbound_preferences",
            ("preference.changed",),
            f"""IF TG_OP = 'DELETE' THEN
        {_INSERT}
        SELECT o.user_id, 'preference.changed', 'u:' || o.user_id, NULL, NULL, o.channel, NULL,
            NULL, jsonb_build_object('scope', o.scope, 'key', o.key, 'channel', o.channel,
                'enabled', NULL)
        FROM old_rows o ORDER BY o.user_id;
    ELSIF TG_OP = 'UPDATE' THEN
        {_INSERT}
        SELECT n.user_id, 'preference.changed', 'u:' || n.user_id, NULL, NULL, n.channel, NULL,
            NULL, jsonb_build_object('scope', n.scope, 'key', n.key, 'channel', n.channel,
                'enabled', n.enabled, 'at', n.updated_at)
        FROM new_rows n JOIN old_rows o USING (user_id, scope, key, channel)
        WHERE n.enabled IS DISTINCT FROM o.enabled ORDER BY n.user_id;
    ELSE
        {_INSERT}
        SELECT n.user_id, 'preference.changed', 'u:' || n.user_id, NULL, NULL, n.channel, NULL,
            NULL, jsonb_build_object('scope', n.scope, 'key', n.key, 'channel', n.channel,
                'enabled', n.enabled, 'at', n.updated_at)
        FROM new_rows n ORDER BY n.user_id;
    END IF;""",
        ),
        _function(
            "outbound_inbox",
            ("inbox.read",),
            f"""{_INSERT}
    SELECT n.user_id, 'inbox.read', 'd:' || n.user_id || ':' || n.delivery_id, d.request_id,
        n.delivery_id, 'in_app', n.type_key, d.occurrence_key,
        jsonb_build_object('event_id', {_EVENT_ID.format(o="d.occurrence_key")},
            'item_id', n.id, 'at', n.read_at)
    FROM new_rows n JOIN old_rows o ON o.user_id = n.user_id AND o.id = n.id
    LEFT JOIN deliveries d ON d.user_id = n.user_id AND d.id = n.delivery_id
    WHERE o.read_at IS NULL AND n.read_at IS NOT NULL ORDER BY n.user_id, n.id;""",
        ),
        """
CREATE FUNCTION outbound_fanout() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbound_sends (endpoint_id, event_id, user_id, stream, next_at, created_at)
    SELECT e.id, n.id, n.user_id, n.stream, '-infinity', n.created_at
    FROM new_rows n JOIN webhook_endpoints e ON n.kind = ANY(e.kinds);
    RETURN NULL;
END $$;
""",
    ]
)

# (trigger, table, operation, function, transition tables)
TRIGGERS = (
    ("requests_outbound", "requests", "INSERT", "outbound_requests", "NEW TABLE AS new_rows"),
    ("decisions_outbound", "decisions", "INSERT", "outbound_decisions", "NEW TABLE AS new_rows"),
    (
        "deliveries_outbound_insert",
        "deliveries",
        "INSERT",
        "outbound_deliveries",
        "NEW TABLE AS new_rows",
    ),
    (
        "deliveries_outbound_update",
        "deliveries",
        "UPDATE",
        "outbound_deliveries",
        "OLD TABLE AS old_rows NEW TABLE AS new_rows",
    ),
    ("incidents_outbound", "incidents", "INSERT", "outbound_incidents", "NEW TABLE AS new_rows"),
    (
        "preferences_outbound_insert",
        "preferences",
        "INSERT",
        "outbound_preferences",
        "NEW TABLE AS new_rows",
    ),
    (
        "preferences_outbound_update",
        "preferences",
        "UPDATE",
        "outbound_preferences",
        "OLD TABLE AS old_rows NEW TABLE AS new_rows",
    ),
    (
        "preferences_outbound_delete",
        "preferences",
        "DELETE",
        "outbound_preferences",
        "OLD TABLE AS old_rows",
    ),
    (
        "inbox_items_outbound",
        "inbox_items",
        "UPDATE",
        "outbound_inbox",
        "OLD TABLE AS old_rows NEW TABLE AS new_rows",
    ),
    (
        "outbound_events_fanout",
        "outbound_events",
        "INSERT",
        "outbound_fanout",
        "NEW TABLE AS new_rows",
    ),
)
FUNCTION_NAMES = sorted({t[3] for t in TRIGGERS})


def upgrade() -> None:
    op.execute(TABLES)
    op.execute(FUNCTIONS)
    for name, table, operation, function, referencing in TRIGGERS:
        op.execute(
            f"CREATE TRIGGER {name} AFTER {operation} ON {table} REFERENCING {referencing} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )


def downgrade() -> None:
    for name, table, *_ in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
    for function in FUNCTION_NAMES:
        op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.execute(
        """
        DROP TABLE outbound_sends;
        DROP TABLE outbound_events;
        DROP TABLE webhook_endpoints;
        DELETE FROM alerts WHERE kind = 'endpoint_disabled';
        ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check;
        ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check
            CHECK (kind IN ('send_rate_drop', 'stuck_work'));
        """
    )
