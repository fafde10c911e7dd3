"""`clarion stats`: what the ledger holds, what was prevented, and what is queued."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from clarion import clock, sentinel, settings
from clarion.db import alerts, meta, reports
from clarion.db.engine import engine
from clarion.ops.table import render
from clarion.scheduling import zones
from clarion.tasks.lanes import queue_depths


def counters(redis_url: str) -> dict[str, int]:
    # No decode_responses: keys and values come back as bytes.
    client = sentinel.client(redis_url, settings.get().sentinel_master)
    raw = cast(dict[bytes, bytes], client.hgetall("clarion:counters"))
    return {k.decode(): int(v) for k, v in raw.items()}


def tz_database(recorded: str | None) -> list[tuple[str, str]]:
    """This install's tz release beside the deployment's (recorded at migration): they must match,
    or this install's workers refuse to start."""
    mine = zones.describe()
    if recorded is None:
        deployment = "none recorded: run `clarion migrate`"
    elif recorded == zones.TZ_DATABASE:
        deployment = f"{recorded} (the same)"
    else:
        deployment = f"{recorded} — DIFFERENT: workers of this install refuse to start"
    return [("this install", mine), ("recorded in the database", deployment)]


def alert_rows(conn) -> list[tuple]:
    """Open alerts and those cleared in the last day, newest first."""
    return [
        (
            a.kind,
            a.subject,
            a.opened_at.strftime("%Y-%m-%d %H:%M:%S"),
            a.cleared_at.strftime("%Y-%m-%d %H:%M:%S") if a.cleared_at else "OPEN",
            a.detail,
        )
        for a in alerts.recent(conn, since=clock.now() - timedelta(days=1))
    ]


def catalog_rows() -> list[tuple]:
    """The catalog this command loads (CLARION_CATALOG, as every clarion process reads it)."""
    from clarion.tasks import runtime

    loaded = runtime.loaded()
    catalog = loaded.current()
    source = f"{catalog.source} (built-in demo)" if loaded.demo else catalog.source
    return [(source, catalog.digest or "-", len(catalog.types))]


def report(database_url: str, redis_url: str, broker_url: str) -> str:
    with engine(database_url).connect() as conn:
        parts = [
            render(["path", "sha256", "types"], catalog_rows(), "Catalog"),
            render(["lane", "state", "requests"], reports.request_counts(conn), "Requests"),
            render(
                ["lane", "channel", "state", "deliveries"],
                reports.delivery_counts(conn),
                "Deliveries",
            ),
            render(
                ["gate", "outcome", "reason", "count"],
                reports.decision_counts(conn),
                "Not delivered, with the recorded reason",
            ),
            render(["kind", "count"], reports.incident_counts(conn), "Incidents"),
            render(
                ["digest type", "state", "windows", "items", "next close (UTC)"],
                reports.digest_counts(conn),
                "Digests",
            ),
            render(
                ["type", "state", "waiting for step", "chains", "next timer (UTC)"],
                reports.escalation_counts(conn),
                "Escalation chains",
            ),
            render(
                ["kind", "subject", "opened (UTC)", "cleared", "detail"],
                alert_rows(conn),
                "Alerts (open, and cleared in the last day)",
            ),
            render(["", "release"], tz_database(meta.get(conn, meta.TZDATA)), "Time zone rules"),
        ]
    parts.append(
        render(
            ["counter", "value"],
            sorted(counters(redis_url).items()),
            "Work found already done (duplicates prevented)",
        )
    )
    parts.append(
        render(
            ["queue", "messages waiting", "consumers"], queue_depths(broker_url), "Broker queues"
        )
    )
    return "\n\n".join(parts)
