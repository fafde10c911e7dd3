"""Tables as SQLAlchemy Core objects, mirroring the Alembic migrations (a test compares the two).

Every primary and unique key of a per-recipient table leads with user_id, so the tables can be
distributed by user_id. The HTTP API's tables (api_keys, api_idempotency) belong to producers, not
recipients, and lead with the API key instead.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Sequence,
    SmallInteger,
    Table,
    Text,
    Time,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, DOUBLE_PRECISION, JSONB, UUID

metadata = MetaData()
SCHEMA_REVISION = "0030"  # the Alembic head these tables mirror (tests/integration/test_schema.py)

LANES = ("transactional", "activation")
REQUEST_STATES = ("pending", "deferred", "routed")
DELIVERY_STATES = (
    "pending",
    "claimed",
    "unknown",
    "sent",
    "delivered",
    "opened",
    "read",
    "clicked",
    "answered",
    "bounced",
    "undelivered",
    "failed",
    "suppressed",
)
# States that hold or have used the right to send: at most one per occurrence and channel.
# `unknown` is one: its attempt may have reached the provider.
SENT_STATES = (
    "sent",
    "delivered",
    "opened",
    "read",
    "clicked",
    "answered",
    "bounced",
    "undelivered",
)
SENDING_STATES = ("claimed", "unknown", *SENT_STATES)
# How one attempt of a delivery ended (delivery_attempts, migration 0028): the provider took it;
# refused, tried again later; the answer was lost (retried, reconciled first); lost and held for an
# operator; failed for good; no attempt left (used up, or its worker died at the last one).
ATTEMPT_OUTCOMES = ("sent", "retrying", "unknown", "held", "failed", "exhausted")
RECEIPT_OUTCOMES = ("applied", "repeated", "stale", "early", "unknown_message", "mismatch")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _ts(name: str, nullable: bool = True) -> Column[datetime]:
    return Column(name, DateTime(timezone=True), nullable=nullable)


recipients = Table(
    "recipients",
    metadata,
    Column("user_id", Text, primary_key=True),
    Column("timezone", Text, nullable=False),
    Column("locale", Text, nullable=False, server_default="en"),
    Column("country", Text),
    Column("org_id", Text),
    Column("addresses", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _ts("created_at", False),
    _ts("updated_at", False),
    Column("quiet_start", Time),
    Column("quiet_end", Time),
    Column("workweek", ARRAY(SmallInteger)),
    Column("subdivision", Text),
    # set by erasure (db/erasure.py, migration 0019): the row stays, emptied, for the occurrence keys
    _ts("erased_at"),
    # the app's own fields, segmentable in broadcasts (migration 0026)
    Column("attributes", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Index(
        "recipients_sms",
        text("(addresses ->> 'sms')"),
        postgresql_where=text("addresses ? 'sms'"),
    ),
)

requests = Table(
    "requests",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("type_key", Text, nullable=False),
    Column("occurrence_key", Text, nullable=False),
    Column("lane", Text, nullable=False),
    Column("template_version", Integer, nullable=False),
    Column("variables", JSONB, nullable=False),
    # the recipient's locale at insert (trigger requests_pin_locale, migrations 0015-0016): pinned
    Column("locale", Text),
    Column("state", Text, nullable=False, server_default="pending"),
    _ts("due_at"),
    _ts("created_at", False),
    _ts("routed_at"),
    Column("rounds", SmallInteger, nullable=False, server_default="0"),
    PrimaryKeyConstraint("user_id", "id", name="requests_pkey"),
    UniqueConstraint("user_id", "type_key", "occurrence_key", name="requests_occurrence_key"),
    # no foreign key to recipients: every insert reads its recipient, none is deleted (0030)
    CheckConstraint(_in("state", REQUEST_STATES), name="requests_state_check"),
    CheckConstraint(_in("lane", LANES), name="requests_lane_check"),
    Index("requests_due", "lane", "due_at", postgresql_where=text("due_at IS NOT NULL")),
    # the activity page's search by request id or event id without a user id (0028); a
    # broadcast's progress reads its requests through requests_occurrence too (0029)
    Index("requests_id", "id"),
    Index("requests_occurrence", "occurrence_key"),
)

deliveries = Table(
    "deliveries",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("request_id", BigInteger, nullable=False),
    Column("type_key", Text, nullable=False),
    Column("occurrence_key", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("one_platform", Boolean, nullable=False),
    Column("lane", Text, nullable=False),
    Column("state", Text, nullable=False, server_default="pending"),
    Column("claim_token", UUID(as_uuid=False)),
    _ts("lease_until"),
    _ts("not_before", False),
    _ts("due_at"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("taken_over", Boolean, nullable=False, server_default=text("false")),
    Column("platform", Text),
    Column("provider_message_id", Text),
    Column("last_error", Text),
    _ts("created_at", False),
    _ts("updated_at", False),
    _ts("sent_at"),
    Column("answer", Text),
    _ts("answered_at"),
    Column("answered_by", Text),
    _ts("send_started_at"),
    _ts("maybe_sent_at"),
    Column("rounds", SmallInteger, nullable=False, server_default="0"),
    PrimaryKeyConstraint("user_id", "id", name="deliveries_pkey"),
    UniqueConstraint("user_id", "request_id", "channel", name="deliveries_request_channel_key"),
    ForeignKeyConstraint(
        ["user_id", "request_id"],
        ["requests.user_id", "requests.id"],
        name="deliveries_request_fkey",
    ),
    CheckConstraint(_in("state", DELIVERY_STATES), name="deliveries_state_check"),
    CheckConstraint(
        f"NOT ({_in('state', SENT_STATES)}) OR platform IS NOT NULL",
        name="deliveries_sent_names_platform",
    ),
    CheckConstraint(
        "state <> 'claimed' OR (claim_token IS NOT NULL AND lease_until IS NOT NULL)",
        name="deliveries_claim_has_token",
    ),
    Index(
        "deliveries_one_send",
        "user_id",
        "type_key",
        "occurrence_key",
        "channel",
        unique=True,
        postgresql_where=text(_in("state", SENDING_STATES)),
    ),
    Index(
        "deliveries_one_platform",
        "user_id",
        "type_key",
        "occurrence_key",
        unique=True,
        postgresql_where=text(f"one_platform AND {_in('state', SENDING_STATES)}"),
    ),
    Index("deliveries_due", "lane", "due_at", postgresql_where=text("due_at IS NOT NULL")),
    Index("deliveries_unknown", "lane", "channel", postgresql_where=text("state = 'unknown'")),
    Index(
        "deliveries_provider_message",
        "provider_message_id",
        postgresql_where=text("provider_message_id IS NOT NULL"),
    ),
)

receipts = Table(
    "receipts",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("delivery_id", BigInteger),
    Column("channel", Text, nullable=False),
    Column("event", Text, nullable=False),
    Column("provider_message_id", Text),
    Column("address", Text),
    Column("event_id", Text),
    Column("detail", Text, nullable=False, server_default=""),
    Column("outcome", Text, nullable=False),
    _ts("occurred_at", False),
    _ts("received_at", False),
    # the provider that reported (a report of its own naming a delivery proves it took the
    # message: db.receipts settles an unknown outcome with it); NULL for clarion's own doors (0022)
    Column("platform", Text),
    PrimaryKeyConstraint("user_id", "id", name="receipts_pkey"),
    CheckConstraint(_in("outcome", RECEIPT_OUTCOMES), name="receipts_outcome_check"),
    Index("receipts_delivery", "user_id", "delivery_id"),
    Index("receipts_early", "received_at", postgresql_where=text("outcome = 'early'")),
)

decisions = Table(
    "decisions",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("request_id", BigInteger, nullable=False),
    Column("delivery_id", BigInteger),
    Column("channel", Text),
    Column("gate", Text, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("detail", Text, nullable=False, server_default=""),
    _ts("decided_at", False),
    PrimaryKeyConstraint("user_id", "id", name="decisions_pkey"),
    Index("decisions_request", "user_id", "request_id"),
)

incidents = Table(
    "incidents",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("delivery_id", BigInteger, nullable=False),
    Column("kind", Text, nullable=False),
    Column("detail", Text, nullable=False, server_default=""),
    _ts("created_at", False),
    PrimaryKeyConstraint("user_id", "id", name="incidents_pkey"),
)

# Every settled attempt of a delivery (0028), written with the settling statement (db/claims.py).
delivery_attempts = Table(
    "delivery_attempts",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("request_id", BigInteger, nullable=False),
    Column("delivery_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("platform", Text),
    Column("error", Text, nullable=False, server_default=""),
    _ts("at", False),
    PrimaryKeyConstraint("user_id", "id", name="delivery_attempts_pkey"),
    CheckConstraint(_in("outcome", ATTEMPT_OUTCOMES), name="delivery_attempts_outcome_check"),
    Index("delivery_attempts_request", "user_id", "request_id"),
)

preferences = Table(
    "preferences",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("scope", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("enabled", Boolean, nullable=False),
    _ts("updated_at", False),
    PrimaryKeyConstraint("user_id", "scope", "key", "channel", name="preferences_pkey"),
    ForeignKeyConstraint(["user_id"], ["recipients.user_id"], name="preferences_user_id_fkey"),
    CheckConstraint("scope IN ('type', 'category', 'all')", name="preferences_scope_check"),
)

suppressions = Table(
    "suppressions",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("address", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("detail", Text, nullable=False, server_default=""),
    _ts("created_at", False),
    # keyed hash of (channel, address) (clarion/hashing.py, 0021); an erased recipient's row keeps
    # only this, as its address too (0019)
    Column("address_hash", Text, nullable=False),
    PrimaryKeyConstraint("user_id", "channel", "address", name="suppressions_pkey"),
    # the gate's lookup by address, whoever the row was recorded for (0021)
    Index("suppressions_address", "channel", "address_hash"),
)

# Suppressions an operator lifted, with who, when and why (migration 0020, db/suppressions.py).
# An audit log, not a per-recipient table: user_id is nullable for per-address entries.
suppression_lifts = Table(
    "suppression_lifts",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("user_id", Text),
    Column("channel", Text, nullable=False),
    Column("address", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("detail", Text, nullable=False, server_default=""),
    _ts("suppressed_at", False),
    Column("lifted_by", Text, nullable=False),
    _ts("lifted_at", False),
    Column("why", Text, nullable=False),
    PrimaryKeyConstraint("id", name="suppression_lifts_pkey"),
    Index("suppression_lifts_address", "channel", "address"),
)

activation_windows = Table(
    "activation_windows",
    metadata,
    Column("user_id", Text, primary_key=True),
    Column("request_id", BigInteger, nullable=False),
    Column("type_key", Text, nullable=False),
    _ts("opened_at", False),
    _ts("until", False),
)

fatigue_counters = Table(
    "fatigue_counters",
    metadata,
    Column("scope", Text, nullable=False),
    Column("bucket", Text, nullable=False),
    Column("count", Integer, nullable=False),
    _ts("expires_at", False),
    PrimaryKeyConstraint("scope", "bucket", name="fatigue_counters_pkey"),
)

collapse_groups = Table(
    "collapse_groups",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("collapse_key", Text, nullable=False),
    Column("leader_id", BigInteger, nullable=False),
    _ts("window_until", False),
    Column("count", Integer, nullable=False),
    PrimaryKeyConstraint("user_id", "collapse_key", name="collapse_groups_pkey"),
)

# Updates owed to a collapse group's leading message (migration 0012, tasks/refresh.py).
collapse_refreshes = Table(
    "collapse_refreshes",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("leader_id", BigInteger, nullable=False),
    Column("collapse_key", Text, nullable=False),
    Column("count", Integer, nullable=False),
    Column("shown", Integer, nullable=False, server_default="1"),
    _ts("window_until", False),
    _ts("due_at"),
    _ts("lease_until"),
    PrimaryKeyConstraint("user_id", "leader_id", name="collapse_refreshes_pkey"),
    Index("collapse_refreshes_due", "due_at", postgresql_where=text("due_at IS NOT NULL")),
    Index("collapse_refreshes_done", "window_until", postgresql_where=text("due_at IS NULL")),
)

SERIES_STATES = ("active", "paused", "ended", "cancelled")
CALENDAR_POLICIES = ("skip", "next_working_day", "send")

series = Table(
    "series",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("series_key", Text, nullable=False),
    Column("type_key", Text, nullable=False),
    Column("anchor_local", DateTime(timezone=False), nullable=False),
    Column("zone", Text, nullable=False),
    Column("every", Text, nullable=False),
    Column("max_count", Integer),
    _ts("until"),
    Column("calendar_policy", Text, nullable=False),
    Column("variables", JSONB, nullable=False),
    Column("state", Text, nullable=False),
    Column("next_n", Integer, nullable=False, server_default="0"),
    _ts("next_due_at"),
    _ts("created_at", False),
    _ts("updated_at", False),
    # (user_id, id) has no index: id is an identity, and the tick's UPDATE pays one index fewer
    # per series (migration 0017)
    PrimaryKeyConstraint("user_id", "series_key", name="series_pkey"),
    ForeignKeyConstraint(["user_id"], ["recipients.user_id"], name="series_user_id_fkey"),
    CheckConstraint(_in("state", SERIES_STATES), name="series_state_check"),
    CheckConstraint(_in("calendar_policy", CALENDAR_POLICIES), name="series_policy_check"),
    CheckConstraint("state <> 'active' OR next_due_at IS NOT NULL", name="series_due_when_active"),
    Index("series_due", "next_due_at", postgresql_where=text("state = 'active'")),
)

interactions = Table(
    "interactions",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("delivery_id", BigInteger),
    Column("platform", Text, nullable=False),
    Column("platform_user", Text, nullable=False),
    Column("answer", Text),
    Column("outcome", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("payload", Text, nullable=False),
    _ts("created_at", False),
    PrimaryKeyConstraint("user_id", "id", name="interactions_pkey"),
    CheckConstraint(
        "outcome IN ('accepted', 'repeated', 'rejected')", name="interactions_outcome_check"
    ),
)

inbox_revisions = Sequence("inbox_revisions", metadata=metadata)

inbox_items = Table(
    "inbox_items",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("delivery_id", BigInteger, nullable=False),
    Column("type_key", Text, nullable=False),
    Column("title", Text, nullable=False, server_default=""),
    Column("body", Text, nullable=False, server_default=""),
    Column("data", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("collapse_key", Text),
    Column("count", Integer, nullable=False, server_default="1"),
    Column("rev", BigInteger, nullable=False),  # inbox_revisions, on insert and every change
    Column("created_rev", BigInteger, nullable=False),
    Column("wxid", BigInteger, nullable=False),  # the writing transaction (pg_current_xact_id)
    _ts("created_at", False),
    _ts("updated_at", False),
    _ts("seen_at"),
    _ts("read_at"),
    _ts("archived_at"),
    PrimaryKeyConstraint("user_id", "id", name="inbox_items_pkey"),
    UniqueConstraint("user_id", "delivery_id", name="inbox_items_delivery_key"),
    CheckConstraint("count >= 1", name="inbox_items_count_check"),
    Index(
        "inbox_feed",
        "user_id",
        text("id DESC"),
        postgresql_where=text("archived_at IS NULL"),
    ),
    Index(
        "inbox_unread",
        "user_id",
        postgresql_where=text("read_at IS NULL AND archived_at IS NULL"),
    ),
    Index("inbox_changes", "user_id", "rev"),
)

ESCALATION_STATES = ("waiting", "acked", "finished")

# One row per chain (tasks/escalation.py): the timer of its next step, which an acknowledgement,
# the step firing and a confirmed failure each change by a conditional update of this row.
escalations = Table(
    "escalations",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("request_id", BigInteger, nullable=False),
    Column("type_key", Text, nullable=False),
    Column("steps", JSONB, nullable=False),
    Column("working_hours", Text),
    Column("next_step", SmallInteger, nullable=False),
    _ts("due_at"),
    Column("due_reason", Text, nullable=False, server_default="no_ack"),
    Column("due_detail", Text, nullable=False, server_default=""),
    Column("state", Text, nullable=False, server_default="waiting"),
    _ts("acked_at"),
    Column("acked_by", Text),
    _ts("created_at", False),
    _ts("updated_at", False),
    PrimaryKeyConstraint("user_id", "id", name="escalations_pkey"),
    UniqueConstraint("user_id", "request_id", name="escalations_request_key"),
    ForeignKeyConstraint(
        ["user_id", "request_id"],
        ["requests.user_id", "requests.id"],
        name="escalations_request_fkey",
    ),
    CheckConstraint(_in("state", ESCALATION_STATES), name="escalations_state_check"),
    CheckConstraint(
        "state <> 'waiting' OR due_at IS NOT NULL", name="escalations_due_when_waiting"
    ),
    Index("escalations_due", "due_at", postgresql_where=text("state = 'waiting'")),
)

# Which chain (and step) a request belongs to; keyed by the request's own user.
escalation_requests = Table(
    "escalation_requests",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("request_id", BigInteger, nullable=False),
    Column("chain_user", Text, nullable=False),
    Column("chain_id", BigInteger, nullable=False),
    Column("step", SmallInteger, nullable=False),
    PrimaryKeyConstraint("user_id", "request_id", name="escalation_requests_pkey"),
    ForeignKeyConstraint(
        ["user_id", "request_id"],
        ["requests.user_id", "requests.id"],
        name="escalation_requests_request_fkey",
    ),
)

# Facts every process of a deployment must share (key "tzdata": the IANA release the migrating
# process computed with). Not per recipient, so no user_id: a reference table when distributed.
clarion_meta = Table(
    "clarion_meta",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
    _ts("updated_at", False),
)

# --- the HTTP API (web/api*.py): not per recipient, see migration 0010 --------------------------

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("prefix", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("secret_sha256", Text, nullable=False),
    Column("scopes", ARRAY(Text), nullable=False),
    Column("rate_limit", Integer, nullable=False),
    Column("rate_window", Integer, nullable=False),
    _ts("created_at", False),
    _ts("revoked_at"),
    _ts("last_used_at"),
    _ts("expires_at"),
    PrimaryKeyConstraint("id", name="api_keys_pkey"),
    UniqueConstraint("prefix", name="api_keys_prefix_key"),
    CheckConstraint("rate_limit > 0 AND rate_window > 0", name="api_keys_rate_check"),
)

api_idempotency = Table(
    "api_idempotency",
    metadata,
    Column("api_key_id", BigInteger, nullable=False),
    Column("key", Text, nullable=False),
    Column("fingerprint", Text, nullable=False),
    Column("status", SmallInteger),
    Column("response", Text),
    _ts("created_at", False),
    _ts("expires_at", False),
    PrimaryKeyConstraint("api_key_id", "key", name="api_idempotency_pkey"),
    ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name="api_idempotency_api_key_fkey"),
    Index("api_idempotency_expires", "expires_at"),
)

# --- alerts (tasks/alerts.py): not per recipient, see migration 0011 ----------------------------

ALERT_KINDS = ("send_rate_drop", "stuck_work", "endpoint_disabled", "provider_failover")

alerts = Table(
    "alerts",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("kind", Text, nullable=False),
    Column("subject", Text, nullable=False),
    _ts("opened_at", False),
    _ts("cleared_at"),
    Column("value", DOUBLE_PRECISION, nullable=False),
    Column("detail", Text, nullable=False, server_default=""),
    _ts("open_posted_at"),
    _ts("clear_posted_at"),
    PrimaryKeyConstraint("id", name="alerts_pkey"),
    CheckConstraint(_in("kind", ALERT_KINDS), name="alerts_kind_check"),
    Index(
        "alerts_open",
        "kind",
        "subject",
        unique=True,
        postgresql_where=text("cleared_at IS NULL"),
    ),
    Index(
        "alerts_unposted",
        "id",
        postgresql_where=text(
            "open_posted_at IS NULL OR (cleared_at IS NOT NULL AND clear_posted_at IS NULL)"
        ),
    ),
)

DIGEST_STATES = ("open", "full", "closed")

digests = Table(
    "digests",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("digest_type", Text, nullable=False),
    Column("digest_key", Text, nullable=False),
    Column("state", Text, nullable=False),
    _ts("opened_at", False),
    _ts("due_at", False),
    _ts("closed_at"),
    Column("max_items", Integer, nullable=False),
    Column("count", Integer, nullable=False),
    Column("items", JSONB, nullable=False),
    Column("request_id", BigInteger),
    PrimaryKeyConstraint("user_id", "id", name="digests_pkey"),
    CheckConstraint(_in("state", DIGEST_STATES), name="digests_state_check"),
    Index(
        "digests_open",
        "user_id",
        "digest_type",
        "digest_key",
        unique=True,
        postgresql_where=text("state = 'open'"),
    ),
    Index("digests_request", "user_id", "request_id"),
)


# --- outbound events (migration 0023, db/outbound.py, tasks/events.py) ---------------------------

# The kinds an app can subscribe to; the triggers of migration 0023 write them.
OUTBOUND_DELIVERY_STATES = tuple(s for s in DELIVERY_STATES if s not in ("pending", "claimed"))
EVENT_KINDS = (
    "request.accepted",
    "gate.stopped",
    *(f"delivery.{s}" for s in OUTBOUND_DELIVERY_STATES),
    "incident.recorded",
    "preference.changed",
    "inbox.read",
    # migration 0026: a broadcast's fan-out (trigger outbound_broadcasts on broadcasts)
    "broadcast.started",
    "broadcast.progress",
    "broadcast.done",
    "broadcast.cancelled",
)

# An app's endpoint: not per recipient (like api_keys).
webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("url", Text, nullable=False),
    Column("kinds", ARRAY(Text), nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("secret", Text, nullable=False),
    Column("previous_secret", Text),
    _ts("previous_until"),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("disabled_reason", Text, nullable=False, server_default=""),
    _ts("failing_since"),
    _ts("created_at", False),
    _ts("updated_at", False),
    PrimaryKeyConstraint("id", name="webhook_endpoints_pkey"),
    CheckConstraint(
        "cardinality(kinds) > 0 AND kinds <@ ARRAY["
        + ", ".join(repr(k) for k in EVENT_KINDS)
        + "]::text[]",
        name="webhook_endpoints_kinds_check",
    ),
)

# The outbox: written by triggers in the transaction of the change it reports. `id` is the
# sequence an app sorts by; `stream` the unit of ordering (a delivery, else a request, else a user).
outbound_events = Table(
    "outbound_events",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("kind", Text, nullable=False),
    Column("stream", Text, nullable=False),
    Column("request_id", BigInteger),
    Column("delivery_id", BigInteger),
    Column("channel", Text),
    Column("type_key", Text),
    Column("occurrence_key", Text),
    Column("data", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("user_id", "id", name="outbound_events_pkey"),
    Index("outbound_events_created", "created_at"),
    Index("outbound_events_request", "user_id", "request_id"),  # GET /v1/requests/{id}
)

# One row per (endpoint, event): pending until the endpoint answers 2xx.
outbound_sends = Table(
    "outbound_sends",
    metadata,
    Column("endpoint_id", BigInteger, nullable=False),
    Column("event_id", BigInteger, nullable=False),
    Column("user_id", Text, nullable=False),
    Column("stream", Text, nullable=False),
    Column("state", Text, nullable=False, server_default="pending"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    _ts("next_at", False),
    _ts("lease_until"),
    Column("last_error", Text, nullable=False, server_default=""),
    _ts("created_at", False),
    _ts("delivered_at"),
    PrimaryKeyConstraint("endpoint_id", "event_id", name="outbound_sends_pkey"),
    ForeignKeyConstraint(
        ["endpoint_id"],
        ["webhook_endpoints.id"],
        name="outbound_sends_endpoint_fkey",
        ondelete="CASCADE",
    ),
    CheckConstraint("state IN ('pending', 'delivered')", name="outbound_sends_state_check"),
    Index(
        "outbound_sends_ready", "endpoint_id", "next_at", postgresql_where=text("state = 'pending'")
    ),
    Index(
        "outbound_sends_stream",
        "endpoint_id",
        "stream",
        "event_id",
        postgresql_where=text("state = 'pending'"),
    ),
    Index("outbound_sends_created", "endpoint_id", "created_at"),
)

# --- audiences and broadcasts (tasks/broadcasts.py, migration 0025) -----------------------------

BROADCAST_STATES = ("running", "done", "cancelled")

topics = Table(
    "topics",
    metadata,
    Column("key", Text, nullable=False),
    _ts("created_at", False),
    PrimaryKeyConstraint("key", name="topics_pkey"),
)

topic_members = Table(
    "topic_members",
    metadata,
    Column("user_id", Text, nullable=False),
    Column("topic_key", Text, nullable=False),
    _ts("created_at", False),
    PrimaryKeyConstraint("user_id", "topic_key", name="topic_members_pkey"),
    ForeignKeyConstraint(["user_id"], ["recipients.user_id"], name="topic_members_user_id_fkey"),
    ForeignKeyConstraint(["topic_key"], ["topics.key"], name="topic_members_topic_key_fkey"),
    Index("topic_members_by_topic", "topic_key", "user_id"),
)

broadcasts = Table(
    "broadcasts",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("idempotency_key", Text),
    Column("type_key", Text, nullable=False),
    Column("lane", Text, nullable=False),
    Column("template_version", Integer, nullable=False),
    Column("variables", JSONB, nullable=False),
    Column("audience", JSONB, nullable=False),
    Column("at_local", Time),
    Column("passed", Text),
    Column("state", Text, nullable=False, server_default="running"),
    Column("planned", BigInteger, nullable=False, server_default="0"),
    Column("skipped", BigInteger, nullable=False, server_default="0"),
    Column("requested", BigInteger, nullable=False, server_default="0"),
    _ts("due_at"),
    _ts("created_at", False),
    _ts("finished_at"),
    _ts("started_at"),  # its first chunk's commit (migration 0026)
    PrimaryKeyConstraint("id", name="broadcasts_pkey"),
    UniqueConstraint("idempotency_key", name="broadcasts_idempotency_key"),
    CheckConstraint(_in("state", BROADCAST_STATES), name="broadcasts_state_check"),
    Index("broadcasts_due", "due_at", postgresql_where=text("due_at IS NOT NULL")),
)

# Every custom attribute name ever set on a recipient (migration 0026): a segment on another
# name is refused. Not per recipient.
recipient_attribute_names = Table(
    "recipient_attribute_names",
    metadata,
    Column("name", Text, nullable=False),
    _ts("created_at", False),
    PrimaryKeyConstraint("name", name="recipient_attribute_names_pkey"),
)

broadcast_waves = Table(
    "broadcast_waves",
    metadata,
    Column("broadcast_id", BigInteger, nullable=False),
    Column("wave", Integer, nullable=False),
    _ts("due_at", False),
    Column("zones", ARRAY(Text)),
    Column("cursor", Text),
    Column("planned", BigInteger, nullable=False, server_default="0"),
    Column("requested", BigInteger, nullable=False, server_default="0"),
    Column("done", Boolean, nullable=False, server_default=text("false")),
    PrimaryKeyConstraint("broadcast_id", "wave", name="broadcast_waves_pkey"),
    ForeignKeyConstraint(
        ["broadcast_id"], ["broadcasts.id"], name="broadcast_waves_broadcast_id_fkey"
    ),
)
