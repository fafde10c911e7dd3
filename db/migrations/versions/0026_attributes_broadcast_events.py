"""Recipients' custom attributes, segmentable in broadcasts (issue 28).

- recipients.attributes: the app's own fields about a recipient (`{"plan": "pro", "seats": 12}`),
  text, integer or boolean values, set through register_recipient(attributes=…) and
  `PUT /v1/users/{id}`. A broadcast's segment may filter on one (`attributes.plan`). Emptied by
  erasure like every other personal column.
- recipient_attribute_names: every attribute name ever set, so that a segment on a name no
  recipient has (a typo) is refused, naming the field, instead of silently reaching nobody (the
  rule topics follow: a topic exists once somebody joined it).

Broadcast progress as outbound events (issue 25 item 1, issue 28):

- broadcasts.started_at: when its fan-out wrote its first chunk (set in that chunk's transaction).
- broadcast.started, broadcast.progress, broadcast.done, broadcast.cancelled join the kinds an
  endpoint may want (webhook_endpoints_kinds_check).
- outbound_broadcasts, a statement-level AFTER UPDATE trigger on broadcasts (as the triggers of
  0023): in the transaction of the chunk or cancel that changed the row, `started` when started_at
  is first set, `progress` each time `requested` crosses another tenth of `planned` while the
  fan-out runs, `done` / `cancelled` when the state leaves running, in that order. The events of
  a broadcast are one stream (`b:<id>`), so the dispatcher delivers them in that order. Their
  user_id is '' (a broadcast is nobody's; the payload shows null). broadcasts is not per
  recipient: one table in either layout.

Revision ID: 0026
Revises: 0025
"""

from alembic import op

revision = "0026"
down_revision = "0025"

OLD_KINDS = (
    "request.accepted",
    "gate.stopped",
    *(
        f"delivery.{s}"
        for s in (
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
    ),
    "incident.recorded",
    "preference.changed",
    "inbox.read",
)
BROADCAST_KINDS = (
    "broadcast.started",
    "broadcast.progress",
    "broadcast.done",
    "broadcast.cancelled",
)


def _array(values: tuple[str, ...]) -> str:
    return "ARRAY[" + ", ".join(f"'{v}'" for v in values) + "]::text[]"


def _kinds_check(kinds: tuple[str, ...]) -> str:
    return f"""
ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_kinds_check;
ALTER TABLE webhook_endpoints ADD CONSTRAINT webhook_endpoints_kinds_check
    CHECK (cardinality(kinds) > 0 AND kinds <@ {_array(kinds)});
"""


_STEP = "floor({r}.requested * 10.0 / nullif({r}.planned, 0))"
_DATA = """jsonb_build_object('broadcast_id', n.id, 'state', n.state, 'planned', n.planned,
            'skipped', n.skipped, 'requested', n.requested,
            'percent', least(100, floor(n.requested * 100.0 / nullif(n.planned, 0))),
            'idempotency_key', n.idempotency_key, 'at', {at})"""

FUNCTION = f"""
CREATE FUNCTION outbound_broadcasts() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    wanted text[];
BEGIN
    SELECT array_agg(DISTINCT k) INTO wanted FROM webhook_endpoints, unnest(kinds) k;
    IF wanted IS NULL OR NOT wanted && {_array(BROADCAST_KINDS)} THEN
        RETURN NULL;
    END IF;
    INSERT INTO outbound_events (user_id, kind, stream, request_id, delivery_id, channel, type_key,
                                 occurrence_key, data)
    SELECT '', e.kind, 'b:' || e.id, NULL, NULL, NULL, e.type_key, 'broadcast:' || e.id, e.data
    FROM (
        SELECT n.id, 1 AS rank, 'broadcast.started' AS kind, n.type_key,
            {_DATA.format(at="n.started_at")} AS data
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE o.started_at IS NULL AND n.started_at IS NOT NULL
        UNION ALL
        SELECT n.id, 2, 'broadcast.progress', n.type_key,
            {_DATA.format(at="now()")}
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.state = 'running' AND {_STEP.format(r="n")} > {_STEP.format(r="o")}
        UNION ALL
        SELECT n.id, 3, 'broadcast.' || n.state, n.type_key,
            {_DATA.format(at="n.finished_at")}
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE o.state = 'running' AND n.state IN ('done', 'cancelled')
    ) e
    WHERE e.kind = ANY(wanted)
    ORDER BY e.id, e.rank;
    RETURN NULL;
END $$;
"""

UPGRADE = f"""
ALTER TABLE recipients ADD COLUMN attributes jsonb NOT NULL DEFAULT '{{}}'::jsonb;
CREATE TABLE recipient_attribute_names (
    name        text NOT NULL,
    created_at  timestamptz NOT NULL,
    CONSTRAINT recipient_attribute_names_pkey PRIMARY KEY (name)
);
ALTER TABLE broadcasts ADD COLUMN started_at timestamptz;
{_kinds_check(OLD_KINDS + BROADCAST_KINDS)}
{FUNCTION}
CREATE TRIGGER broadcasts_outbound AFTER UPDATE ON broadcasts
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbound_broadcasts();
"""

DOWNGRADE = f"""
DROP TRIGGER broadcasts_outbound ON broadcasts;
DROP FUNCTION outbound_broadcasts();
UPDATE webhook_endpoints SET kinds = ARRAY(
    SELECT k FROM unnest(kinds) k WHERE NOT k = ANY({_array(BROADCAST_KINDS)}));
DELETE FROM webhook_endpoints WHERE cardinality(kinds) = 0;
{_kinds_check(OLD_KINDS)}
ALTER TABLE broadcasts DROP COLUMN started_at;
DROP TABLE recipient_attribute_names;
ALTER TABLE recipients DROP COLUMN attributes;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
