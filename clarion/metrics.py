"""Prometheus metrics, correct under Celery's prefork pool.

Every process that counts (worker pool children, the beat tick, `clarion web` taking receipts)
writes to prometheus_client's multiprocess files in one folder per host
(`PROMETHEUS_MULTIPROC_DIR`, default `$CLARION_HOME/metrics`), and `/metrics` sums them. The
folder must be chosen before prometheus_client is first imported in a process — this module does
it at import, so import it (not prometheus_client) first. A pool child's files are merged when it
exits (`process_exited`).

What the ledger already knows (open claims, unknown outcomes, queue depths, the oldest due row) is
read at scrape time by `LedgerCollector` instead of being counted in two places; the tick's lag is
`clarion_oldest_due_seconds` (how long the oldest due row has waited for a tick to publish it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or str(
    Path(os.environ.get("CLARION_HOME") or Path.cwd() / ".clarion") / "metrics"
)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _DIR
Path(_DIR).mkdir(parents=True, exist_ok=True)

from prometheus_client import Counter, Histogram  # noqa: E402 - after the folder is set

# Latency buckets from a second (a send) to a day (a quiet-hours deferral).
LATENCY = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400)

SENDS = Counter(
    "clarion_sends",
    "Provider calls by outcome: sent, failed, retry, unknown, deferred (attempt refunded)",
    ["lane", "channel", "outcome"],
)
SUPPRESSED = Counter(
    "clarion_suppressed", "Requests or channels not sent, by gate and reason", ["gate", "reason"]
)
INCIDENTS = Counter("clarion_incidents", "Incidents recorded, by kind", ["kind"])
RECEIPTS = Counter(
    "clarion_receipts",
    "Provider receipts by channel, event and outcome",
    ["channel", "event", "outcome"],
)
EVENT_TO_SENT = Histogram(
    "clarion_event_to_sent_seconds",
    "From notify() to the provider taking the message",
    ["lane", "channel"],
    buckets=LATENCY,
)
EVENT_TO_DELIVERED = Histogram(
    "clarion_event_to_delivered_seconds",
    "From notify() to the provider's delivered receipt",
    ["channel"],
    buckets=LATENCY,
)
TICK_SECONDS = Histogram(
    "clarion_tick_seconds", "Duration of one beat tick", buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 5)
)
TICK_TAKEN = Counter("clarion_tick_taken", "Rows the tick published or fired", ["kind"])


def folder() -> str:
    return _DIR


def count_decisions(decisions: Iterable[tuple[str, str, str]]) -> None:
    """clarion_suppressed_total for decisions just recorded, as (gate, outcome, reason): every
    one that is not an `allow` (what `clarion explain` lists as why not, or not yet)."""
    for gate, outcome, reason in decisions:
        if outcome != "allow":
            SUPPRESSED.labels(gate, reason).inc()


def process_exited(pid: int) -> None:
    """Merge a finished process's live gauges away (its counters stay in the sums)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, _DIR)


def exposition() -> tuple[bytes, str]:
    """This host's metrics in the Prometheus text format, with the ledger's gauges."""
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        generate_latest,
        multiprocess,
    )

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=_DIR)
    registry.register(LedgerCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST


class LedgerCollector:
    """Gauges read from PostgreSQL and the broker at scrape time."""

    def collect(self):  # type: ignore[no-untyped-def]
        from prometheus_client.core import GaugeMetricFamily

        from clarion import clock
        from clarion.db import reports
        from clarion.db.alerts import open_alerts
        from clarion.db.engine import engine

        states = GaugeMetricFamily(
            "clarion_open_deliveries",
            "Deliveries not settled yet: pending, claimed (open claims), unknown (held)",
            labels=["lane", "channel", "state"],
        )
        oldest = GaugeMetricFamily(
            "clarion_oldest_due_seconds",
            "Age of the oldest row due for work, per kind and lane (stuck work)",
            labels=["kind", "lane"],
        )
        windows = GaugeMetricFamily(
            "clarion_digest_windows",
            "Digest windows not closed yet, per digest type and state (open, full)",
            labels=["digest_type", "state"],
        )
        buffered = GaugeMetricFamily(
            "clarion_digest_items",
            "Items buffered in digest windows not closed yet, per digest type",
            labels=["digest_type"],
        )
        chains = GaugeMetricFamily(
            "clarion_escalations_waiting",
            "Escalation chains waiting on a timer, per type and the step it is for",
            labels=["type", "step"],
        )
        alerts = GaugeMetricFamily(
            "clarion_alerts_open",
            "Alerts firing (db.alerts: send_rate_drop per channel, stuck_work per kind and lane)",
            labels=["kind", "subject"],
        )
        with engine().connect() as conn:
            for alert in open_alerts(conn):
                alerts.add_metric([alert.kind, alert.subject], 1)
            for lane, channel, state, n in reports.open_deliveries(conn):
                states.add_metric([lane, channel, state], n)
            for kind, lane, age in reports.oldest_due(conn, clock.now()):
                oldest.add_metric([kind, lane], age)
            items: dict[str, float] = {}
            for digest_type, state, n, count, _ in reports.digest_counts(conn):
                if state != "closed":
                    windows.add_metric([digest_type, state], n)
                    items[digest_type] = items.get(digest_type, 0) + count
            for digest_type, count in items.items():
                buffered.add_metric([digest_type], count)
            for type_key, state, step, n, _ in reports.escalation_counts(conn):
                if state == "waiting":
                    chains.add_metric([type_key, str(step)], n)
        yield from (states, oldest, windows, buffered, chains, alerts)
        depth = GaugeMetricFamily(
            "clarion_queue_depth", "Messages waiting in each broker queue", labels=["queue"]
        )
        try:
            from clarion import settings
            from clarion.ops.stats import queue_depths

            for queue, waiting, _ in queue_depths(settings.get().urls()[2]):
                depth.add_metric([queue], waiting)
        except Exception:  # the broker is down: the other gauges still answer
            pass
        yield depth
