"""Typed settings, read once from CLARION_* environment variables. Nothing else reads the environment.

With no CLARION_DATABASE_URL / CLARION_REDIS_URL, the URLs come from the embedded services
(`db.embedded`), which publish them in `<home>/embedded.json` while they run.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import urlsplit, urlunsplit

from clarion.errors import ConfigurationError, ServicesUnavailable

EMBEDDED_FILE = "embedded.json"
DEV_WEBHOOK_SECRET = "clarion-dev-secret"  # public: refused once CLARION_DATABASE_URL is set
# Never shown by repr(Settings); an empty value for one of these is an error, not "unset".
SECRETS = frozenset(
    {
        "webhook_secret",
        "slack_token",
        "slack_signing_secret",
        "teams_app_password",
        "sendgrid_api_key",
        "sendgrid_backup_api_key",
        "twilio_auth_token",
        "twilio_backup_auth_token",
        "flower_basic_auth",
        "link_secret",
        "address_secret",
    }
)
URLS = frozenset(
    {"database_url", "redis_url", "broker_url", "listen_database_url"}
)  # their passwords are masked in repr


def at_least(low: float) -> dict[str, Any]:
    return {"check": lambda v: v >= low, "rule": f">= {low:g}"}


def share() -> dict[str, Any]:
    return {"check": lambda v: 0 < v <= 1, "rule": "in (0, 1]"}


def positive() -> dict[str, Any]:
    return {"check": lambda v: v > 0, "rule": "> 0"}


def providers(*names: str) -> dict[str, Any]:
    """A comma-separated list of distinct names among `names`."""

    def check(value: str) -> bool:
        listed = [n.strip() for n in value.split(",")]
        return bool(listed) and len(set(listed)) == len(listed) and set(listed) <= set(names)

    return {"check": check, "rule": f"distinct names among {', '.join(names)}, comma-separated"}


# A PostgreSQL schema name that needs no quoting; not one PostgreSQL or a host app owns. At most
# 52 characters: its partitions' schema adds "_partitions" within PostgreSQL's 63.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,51}")
_RESERVED_SCHEMAS = frozenset({"public", "information_schema"})


def schema_name() -> dict[str, Any]:
    return {
        "check": lambda v: (
            _SCHEMA_NAME.fullmatch(v) is not None
            and v not in _RESERVED_SCHEMAS
            and not v.startswith("pg_")
        ),
        "rule": "a lower-case identifier (a-z, 0-9, _; at most 52 characters), "
        "not public, information_schema or pg_*",
    }


@dataclass(frozen=True, repr=False)
class Settings:
    """One field per setting, CLARION_<NAME> in the environment. `metadata=` holds the range check
    (`at_least(n)`, `positive()`), applied on construction."""

    # the data folder: embedded servers, beat schedule, logs, metrics
    home: Path = field(default_factory=lambda: Path.cwd() / ".clarion")
    database_url: str | None = None  # postgresql://… (psycopg 3); unset: the embedded PostgreSQL
    redis_url: str | None = None  # Redis for counters and budgets; unset: the embedded Redis
    broker_url: str | None = None  # the Celery broker (RabbitMQ amqp://… too); unset: the Redis
    # the master's name in Redis Sentinel's configuration, needed when CLARION_BROKER_URL or
    # CLARION_REDIS_URL is sentinel://s1:26379;sentinel://s2:26379/0 (clarion/sentinel.py)
    sentinel_master: str | None = None
    # the catalog YAML (reloaded when it changes) or package.module:NAME; unset: the demo catalog
    catalog: Path | None = None
    claim_lease: float = field(
        default=60.0, metadata=positive()
    )  # seconds a claim holds the right to send (PostgreSQL's clock)
    send_timeout: float = field(
        default=20.0, metadata=positive()
    )  # hard budget of one send, all its provider calls
    catalog_skew_grace: float = field(
        default=600.0, metadata=positive()
    )  # a type/version unknown here waits this long for a newer worker
    republish_cap: float = field(
        default=300.0, metadata=positive()
    )  # longest wait between republishes of a row making no progress
    stray_after: float = field(
        default=30.0, metadata=positive()
    )  # seconds before a published-but-untouched row is published again
    max_attempts: int = field(default=8, metadata=at_least(1))  # attempts, then retries_exhausted
    batch_size: int = field(default=100, metadata=at_least(1))  # rows per route/deliver message
    broadcast_chunk: int = field(
        default=5000, metadata=at_least(1)
    )  # recipients a broadcast's fan-out requests per transaction
    broadcast_fills: int = field(
        default=2, metadata=at_least(1)
    )  # chunks of one wave a fan-out writes at once, each on its own connection
    send_concurrency: int = field(
        default=8, metadata=at_least(1)
    )  # most sends in flight at once within one deliver batch (fewer for a fast provider)
    sent_flush_rows: int = field(
        default=20, metadata=at_least(1)
    )  # "sent" records written by one statement at most (group commit); bounds the crash window
    sent_flush_ms: float = field(
        default=10.0, metadata=positive()
    )  # longest a send's "sent" record waits for its group's statement
    activation_per_second: float | None = field(
        default=None, metadata=at_least(1)
    )  # activation-lane requests routed per second, all workers (tasks/lanes.py); unset: no cap
    # (at least 1: a route batch of CLARION_BATCH_SIZE must finish well inside the visibility timeout)
    bulk_feedback: str = field(
        default="off", metadata={"check": lambda v: v in ("on", "off"), "rule": "on or off"}
    )  # on: bulk lanes (activation: nudges, broadcasts, digests) give way to transactional work
    # in flight and pace themselves by an AIMD rule (tasks/lanes.py). Off by default: it has not
    # shown a gain yet (bench/RESULTS.md, lanes)
    bulk_sends_beside: int = field(
        default=1, metadata=at_least(0)
    )  # sends a bulk lane's batch keeps in flight while transactional work is about (a
    # transactional task began in the last 2 s; tasks/lanes.py); 0: CLARION_SEND_CONCURRENCY
    bulk_nice: int = field(
        default=10, metadata={"check": lambda v: 0 <= v <= 19, "rule": "in 0..19"}
    )  # CPU niceness a worker that consumes only bulk lanes takes at start (0: as the others),
    # for its session too where it leads one (Linux autogroup; tasks/lanes.py nice_session)
    bulk_nice_database: str = field(
        default="on", metadata={"check": lambda v: v in ("on", "off"), "rule": "on or off"}
    )  # on: that worker's PostgreSQL backends take the same niceness (and their sessions',
    # autogroup), where the server runs on this host as a user the worker may renice (the
    # embedded default); elsewhere nothing changes
    webhook_url: str | None = None  # default endpoint for webhook types without config.webhook.url
    # HMAC key of webhook signatures (and, derived, of email Message-IDs); the public default is
    # refused once CLARION_DATABASE_URL is set
    webhook_secret: str = DEV_WEBHOOK_SECRET
    webhook_timeout: float = field(default=10.0, metadata=positive())  # per request, all of it
    visibility_timeout: int = field(default=600, metadata=at_least(1))  # Redis broker's; a backstop
    tick_interval: float = field(default=1.0, metadata=positive())  # seconds between beat ticks
    series_grace: float = field(
        default=7200.0, metadata=positive()
    )  # an occurrence later than this is recorded as missed, not sent
    variables_max_depth: int = field(
        default=16, metadata=at_least(1)
    )  # nesting of notify() variables
    variables_max_bytes: int = field(
        default=65536, metadata=at_least(2)
    )  # notify() variables as compact JSON
    slack_token: str | None = None  # bot token; the slack channel exists when it is set
    slack_api_url: str = "https://slack.com/api/"  # the Web API (tests: a local stand-in)
    slack_signing_secret: str | None = None  # for POST /slack/events (unset: it answers 404)
    slack_updates_per_minute: int = field(
        default=50, metadata=at_least(1)
    )  # chat.update calls per minute per workspace (Tier 3; clarion spends 90%)
    teams_app_id: str | None = (
        None  # the teams channel exists when it is set ("none": no auth, local only)
    )
    teams_app_password: str | None = None  # the app's client secret
    teams_tenant_id: str | None = None  # a single-tenant app's tenant; unset: multi-tenant
    # where providers reach clarion web (status callbacks, one-click unsubscribe links) and where
    # recipients open their preferences page (`clarion link`)
    public_url: str = "http://127.0.0.1:8000"
    # HMAC key of the signed preferences links (clarion/links.py); unset: a key derived from
    # CLARION_WEBHOOK_SECRET (itself refused as the public development secret with a database URL)
    link_secret: str | None = None
    # HMAC key of suppressed addresses (suppressions.address_hash, matched for every recipient;
    # clarion/hashing.py); unset: derived from CLARION_WEBHOOK_SECRET. Changing it makes the
    # suppressions recorded for other recipients (and erased ones') stop matching.
    address_secret: str | None = None

    # --- email ---------------------------------------------------------------------------------
    # smtp://host:port, smtp+starttls://user:pass@host:587 or smtps://user:pass@host:465
    smtp_url: str | None = None
    email_from: str = "Clarion <notify@clarion.invalid>"  # transactional identity
    email_from_marketing: str | None = None  # activation/marketing identity (default: email_from)
    sendgrid_api_key: str | None = None  # the email channel goes through SendGrid when set
    sendgrid_api_url: str = "https://api.sendgrid.com"  # tests and the demo: a local stand-in
    sendgrid_webhook_public_key: str | None = None  # the Event Webhook's ECDSA verification key
    sendgrid_ip_pool: str | None = None  # the transactional identity's IP pool, if any
    sendgrid_ip_pool_marketing: str | None = None  # the marketing/activation identity's IP pool
    sendgrid_asm_group: str | None = (
        None  # unsubscribe group id (digits) for non-transactional mail
    )
    email_timeout: float = field(
        default=10.0, metadata=positive()
    )  # seconds per SMTP command / SendGrid request
    email_per_second: int = field(
        default=10, metadata=at_least(1)
    )  # messages per second per relay credential or API key (clarion spends 90%)
    # the email providers in order of preference, comma-separated: sendgrid, sendgrid_backup,
    # smtp (adapters/failover.py); unset: sendgrid (and sendgrid_backup when its key is set),
    # else smtp
    email_providers: str | None = field(
        default=None, metadata=providers("sendgrid", "sendgrid_backup", "smtp")
    )
    sendgrid_backup_api_key: str | None = None  # a second SendGrid account (sendgrid_backup)
    sendgrid_backup_api_url: str = "https://api.sendgrid.com"  # its API (tests: a stand-in)
    sendgrid_backup_webhook_public_key: str | None = None  # its Event Webhook's ECDSA key

    # --- sms -----------------------------------------------------------------------------------
    twilio_account_sid: str | None = None  # the sms channel exists when it is set
    # sends, and checks X-Twilio-Signature (unset: the Twilio webhooks answer 404)
    twilio_auth_token: str | None = None
    twilio_api_url: str | None = None  # a local Twilio stand-in (default: Twilio's own)
    twilio_from: str | None = None  # an E.164 long code or a Messaging Service SID (MG…)
    sms_segments_per_second: float = field(default=1.0, metadata=positive())  # per long code
    twilio_timeout: float = field(default=10.0, metadata=positive())  # connect + read, one call
    # the sms providers in order of preference: twilio, twilio_backup; unset: twilio (and
    # twilio_backup when its account is set)
    sms_providers: str | None = field(default=None, metadata=providers("twilio", "twilio_backup"))
    twilio_backup_account_sid: str | None = None  # a second Twilio account (twilio_backup)
    twilio_backup_auth_token: str | None = None  # sends, and checks its callbacks' signatures
    twilio_backup_api_url: str | None = None  # its stand-in (default: Twilio's own)
    twilio_backup_from: str | None = None  # its own number or Messaging Service (its own budget)

    # --- provider failover (adapters/circuit.py) --------------------------------------------
    circuit_failures: int = field(
        default=5, metadata=at_least(1)
    )  # failures, timeouts or 5xx in a row that open a provider's circuit (the next takes over)
    circuit_open_seconds: float = field(
        default=30.0, metadata=positive()
    )  # seconds an open circuit sends to the next provider before one probe tries it again
    circuit_probe_seconds: float = field(
        default=30.0, metadata=positive()
    )  # seconds a probe may go unanswered (its worker died) before another probe is let through

    # --- push ----------------------------------------------------------------------------------
    fcm_service_account: Path | None = None  # service-account JSON; FCM devices when set
    fcm_api_url: str = "https://fcm.googleapis.com"  # tests and the demo: a local stand-in
    apns_key: Path | None = None  # the .p8 token-signing key; APNs devices when set
    apns_key_id: str | None = None  # the key's id (required with apns_key)
    apns_team_id: str | None = None  # the team's id (required with apns_key)
    apns_topic: str | None = None  # the app's bundle id
    apns_url: str = "https://api.push.apple.com"  # sandbox: https://api.sandbox.push.apple.com
    apns_ca_file: Path | None = None  # CA bundle to trust for apns_url (a local stand-in's)
    push_timeout: float = field(default=10.0, metadata=positive())  # per device request

    # --- in-app --------------------------------------------------------------------------------
    # days an in-app item is kept; then the retention job removes it
    inbox_keep_days: int = field(default=90, metadata=at_least(1))
    inbox_heartbeat: float = field(default=15.0, metadata=positive())  # seconds between SSE pings

    # --- outbound events to apps' endpoints (tasks/events.py) ---------------------------------
    events_timeout: float = field(
        default=5.0, metadata=positive()
    )  # seconds one POST to an app's endpoint may take, all of it
    events_batch: int = field(
        default=50, metadata=at_least(1)
    )  # events leased per endpoint at once (the head of each delivery's stream)
    events_round: float = field(
        default=5.0, metadata=positive()
    )  # seconds one dispatch round keeps posting to an endpoint before the next round's turn
    events_parallel: int = field(
        default=1, metadata=at_least(1)
    )  # processes posting to one endpoint at once; a dispatch finding them all busy skips it
    events_first_retry: float = field(
        default=5.0, metadata=positive()
    )  # seconds before an event refused once is tried again; doubling each time, up to an hour
    events_disable_after: float = field(
        default=86400.0, metadata=at_least(60)
    )  # seconds an endpoint may fail without a success before it is disabled (with an alert)
    events_overlap: float = field(
        default=86400.0, metadata=at_least(0)
    )  # seconds the previous secret still signs after a rotation

    # --- alerts (tasks/alerts.py) and Flower ----------------------------------------------------
    alert_interval: float = field(default=60.0, metadata=positive())  # seconds between evaluations
    alert_window: float = field(
        default=300.0, metadata=at_least(60)
    )  # seconds of send outcomes a channel's failure share is taken over (whole minutes)
    alert_failure_share: float = field(
        default=0.5, metadata=share()
    )  # failed or unknown sends / all sends in the window at which a channel's alert fires
    alert_min_sends: int = field(
        default=20, metadata=at_least(1)
    )  # sends in the window below which a channel's share says nothing
    alert_stuck_after: float = field(
        default=300.0, metadata=positive()
    )  # seconds the oldest due row may wait before the stuck-work alarm fires
    alert_webhook_url: str | None = None  # each firing and clearing is POSTed here, signed
    flower_basic_auth: str | None = None  # "user:password[,user2:password2]" for `clarion flower`
    log_format: str = field(
        default="text", metadata={"check": lambda v: v in ("text", "json"), "rule": "text or json"}
    )  # json: one JSON object per line, from every process
    metrics_db_timeout: float = field(
        default=2.0, metadata=positive()
    )  # seconds /metrics waits for PostgreSQL (and the broker); then clarion_database_up 0

    schema: str = field(
        default="clarion", metadata=schema_name()
    )  # the PostgreSQL schema holding all of clarion's tables (db/engine.py); partitions: <schema>_partitions
    database_pooler: str = field(
        default="none",
        metadata={"check": lambda v: v in ("none", "transaction"), "rule": "none or transaction"},
    )  # transaction: CLARION_DATABASE_URL is a pooler in transaction mode (pgbouncer): no prepared
    # statements or startup options; the server must give clarion's role its search_path
    listen_database_url: str | None = None  # a session connection for the inbox's LISTEN
    # (straight to PostgreSQL when CLARION_DATABASE_URL is a transaction pooler); unset: that URL

    # --- scale (db/partitioning.py, tasks/retention.py) ---------------------------------------
    partitions: int | None = field(
        default=None, metadata=at_least(2)
    )  # `clarion migrate` hash-partitions the per-recipient tables by user_id into this many
    retention_days: int = field(
        default=90, metadata=at_least(1)
    )  # finished requests, deliveries, decisions… older than this are removed by the beat job
    retention_batch: int = field(
        default=5000, metadata=at_least(1)
    )  # rows of one table removed per statement (each in its own short transaction)

    # --- start and stop (tasks/startup.py, ops/launch.py) ---------------------------------------
    start_wait: float = field(
        default=60.0, metadata=at_least(0)
    )  # seconds a starting worker waits for its broker and database before exiting 75 (retry)
    shutdown_grace: float = field(
        default=60.0, metadata=at_least(0)
    )  # seconds `clarion worker` lets running tasks finish after SIGTERM before a cold stop

    faults: str = ""  # fault points for tests, e.g. deliver.after_send=crash*3 (clarion/faults.py)
    faults_dir: Path | None = None  # where the faults' *times are counted (default <home>/faults)

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_field(f, getattr(self, f.name))
        sentinel_urls = [
            n
            for n in ("redis_url", "broker_url")
            if (getattr(self, n) or "").startswith("sentinel:")
        ]
        if sentinel_urls and not self.sentinel_master:
            raise ConfigurationError(
                f"CLARION_{sentinel_urls[0].upper()} is a Redis Sentinel URL: set "
                "CLARION_SENTINEL_MASTER to the master's name in the sentinels' configuration"
            )
        if sentinel_urls:
            from clarion.sentinel import parse  # only here: it imports redis

            for name in sentinel_urls:
                parse(getattr(self, name), f"CLARION_{name.upper()}")

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={_shown(f.name, getattr(self, f.name))}" for f in fields(self))
        return f"Settings({shown})"

    def urls(self) -> tuple[str, str, str]:
        """(database, redis, broker) URLs: explicit settings first, else the running embedded services."""
        db, redis = self.database_url, self.redis_url
        if not (db and redis):
            embedded = read_embedded(self.home)
            if embedded is None:
                missing = [
                    n
                    for n, v in (("CLARION_DATABASE_URL", db), ("CLARION_REDIS_URL", redis))
                    if not v
                ]
                raise ServicesUnavailable(
                    f"{' and '.join(missing)} not set and no embedded services are running in "
                    f"{self.home}; start them with `clarion services` or set the variables"
                )
            db = db or embedded["database_url"]
            redis = redis or embedded["redis_url"]
        return db, redis, self.broker_url or redis


class Embedded(TypedDict):
    """What a live embedded-services process publishes in EMBEDDED_FILE."""

    pid: int
    database_url: str
    redis_url: str


def read_embedded(home: Path) -> Embedded | None:
    """The URLs published by a live embedded-services process, or None."""
    path = home / EMBEDDED_FILE
    try:
        data: Embedded = json.loads(path.read_text())
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data


_KINDS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "Path": (Path,),
}


def _check_field(f: Field[Any], value: object) -> None:
    """The field's type (from its annotation) and its range rule, if any."""
    kind = str(f.type)
    if value is None and "None" in kind:
        return
    base = kind.split("|")[0].strip()
    name = f"CLARION_{f.name.upper()}"
    if isinstance(value, bool) or not isinstance(value, _KINDS[base]):
        raise ConfigurationError(f"{name} must be a {base}, not {type(value).__name__}")
    if base == "float" and not math.isfinite(value):  # type: ignore[arg-type]
        raise ConfigurationError(f"{name}={value!r} must be a finite number")
    rule = f.metadata.get("check")
    if rule is not None and not rule(value):
        raise ConfigurationError(f"{name}={value!r} must be {f.metadata['rule']}")


def _shown(name: str, value: object) -> str:
    if name in SECRETS and value:
        return "'***'"
    if name in URLS | {
        "webhook_url",
        "alert_webhook_url",
        "slack_api_url",
        "smtp_url",
    } and isinstance(value, str):
        return repr(mask_url(value))
    return repr(value)


def mask_url(url: str) -> str:
    """The URL with its password (if any) replaced by ***."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:
        return "***"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def _convert(name: str, kind: type | str, raw: str) -> float | int | Path | str:
    try:
        if kind in (float, "float", "float | None"):
            return float(raw)
        if kind in (int, "int", "int | None"):
            return int(raw)
        if "Path" in str(kind):
            return Path(raw)
        return raw
    except ValueError as exc:
        raise ConfigurationError(f"CLARION_{name.upper()}={raw!r} is not a valid {kind}") from exc


def from_env(environ: Mapping[str, str] = os.environ) -> Settings:
    """Build Settings from CLARION_* variables; unknown CLARION_* names are an error.

    An empty variable counts as unset (so `CLARION_X=` in a compose file means "the default"),
    except for secrets, where an empty value is an error rather than a silent fallback."""
    known = {f.name: f for f in fields(Settings)}
    values: dict[str, Any] = {}  # each checked against its field by Settings.__post_init__
    for key, raw in environ.items():
        if not key.startswith("CLARION_"):
            continue
        name = key.removeprefix("CLARION_").lower()
        if raw == "":
            if name in SECRETS:
                raise ConfigurationError(
                    f"{key} is set but empty: give the secret, or unset the variable"
                )
            continue
        if name not in known:
            raise ConfigurationError(f"unknown setting {key}")
        values[name] = _convert(name, known[name].type, raw)
    if (
        values.get("database_url")
        and values.get("webhook_secret", DEV_WEBHOOK_SECRET) == DEV_WEBHOOK_SECRET
    ):
        raise ConfigurationError(
            "CLARION_DATABASE_URL is set but CLARION_WEBHOOK_SECRET is not (or is the public development "
            f"secret {DEV_WEBHOOK_SECRET!r}): set CLARION_WEBHOOK_SECRET to a secret of your own"
        )
    if values.get("database_url") and values.get("link_secret") == DEV_WEBHOOK_SECRET:
        raise ConfigurationError(
            "CLARION_DATABASE_URL is set and CLARION_LINK_SECRET is the public development secret "
            f"{DEV_WEBHOOK_SECRET!r}: set a secret of your own, or unset it to derive one from "
            "CLARION_WEBHOOK_SECRET"
        )
    return Settings(**values)


@lru_cache(maxsize=1)
def get() -> Settings:
    """The process-wide settings (read on first use, not at import)."""
    return from_env()


def reset() -> None:
    """Forget cached settings so the next get() reads the environment again (tests, launchers)."""
    get.cache_clear()
