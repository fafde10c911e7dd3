"""What `/metrics` serves: every process's counters (clarion.metrics, summed from the multiprocess
folder), `clarion_database_up`, and gauges read at scrape time from the ledger and the broker, each
read bounded so a database or broker that hangs never hangs the scrape."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from clarion import metrics
from clarion.tasks.lanes import queue_depths

if TYPE_CHECKING:
    from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)


def exposition() -> tuple[bytes, str]:
    """This host's metrics in the Prometheus text format: every process's counters, summed, then
    `clarion_database_up` and the ledger's gauges (when the database answers in time)."""
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        generate_latest,
        multiprocess,
    )

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=metrics.setup())
    registry.register(LedgerCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST


T = TypeVar("T")


class Deadline:
    """Runs a read in a daemon thread and waits at most `timeout` seconds for it. A read still
    running from an earlier call (a database that hangs) is not joined by a second one: the caller
    gets None at once, so scrapes neither hang nor pile up threads."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._running: Future[Any] | None = None

    def run(self, read: Callable[[], T], timeout: float) -> T | None:
        if self._running is not None and not self._running.done():
            return None
        future: Future[T] = Future()
        self._running = future

        def target() -> None:
            try:
                future.set_result(read())
            except BaseException as exc:  # handed to the caller, who reports "down"
                future.set_exception(exc)

        threading.Thread(target=target, name=f"metrics-{self.name}", daemon=True).start()
        try:
            return future.result(timeout)
        except Exception as exc:  # TimeoutError, or the read failed: the source is down
            log.debug(
                "%s did not answer the scrape: %r",
                self.name,
                exc,
                extra={"action": "metrics_source_down", "source": self.name},
            )
            return None


_DATABASE = Deadline("database")
_BROKER = Deadline("broker")


def _ledger_engine(url: str, timeout: float) -> Any:
    """A pool-less engine whose connect and statements are bounded by `timeout` (server side)."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from clarion import settings
    from clarion.db.engine import (
        check_search_path,
        normalise_url,
        pooled_transactions,
        timeout_args,
        use_schema,
    )

    eng = create_engine(
        normalise_url(url),
        poolclass=NullPool,
        connect_args=timeout_args(timeout, timeout),
    )
    (check_search_path if pooled_transactions() else use_schema)(
        eng, settings.get().schema
    )  # the ledger's tables are in clarion's schema
    return eng


def _read_ledger(url: str, timeout: float) -> dict[str, list[tuple[Any, ...]]]:
    from clarion import clock
    from clarion.db import broadcasts, reports
    from clarion.db.alerts import open_alerts

    eng = _ledger_engine(url, timeout)
    try:
        with eng.connect() as conn:
            shown = broadcasts.shown_in_metrics(conn, now=clock.now())
            return {
                "alerts": [(a.kind, a.subject) for a in open_alerts(conn)],
                "open": [tuple(r) for r in reports.open_deliveries(conn)],
                "oldest": [tuple(r) for r in reports.oldest_due(conn, clock.now())],
                "digests": [tuple(r) for r in reports.digest_counts(conn)],
                "escalations": [tuple(r) for r in reports.escalation_counts(conn)],
                "broadcasts": [
                    (b.id, b.type_key, b.state, b.planned, b.requested, b.sent, b.waiting)
                    for b in shown
                ],
                "broadcast_reasons": [
                    (b.id, b.type_key, reason, n)
                    for b in shown
                    for reason, n in b.suppressed.items()
                ],
            }
    finally:
        eng.dispose()


class LedgerCollector:
    """`clarion_database_up`, and gauges read from PostgreSQL and the broker at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        from clarion import settings

        s = settings.get()
        db_url, _, broker_url = s.urls()
        ledger = _DATABASE.run(
            lambda: _read_ledger(db_url, s.metrics_db_timeout), s.metrics_db_timeout
        )
        up = GaugeMetricFamily(
            "clarion_database_up", "1 if PostgreSQL answered this scrape in time, else 0"
        )
        up.add_metric([], 1 if ledger is not None else 0)
        yield up
        if ledger is not None:
            yield from _ledger_families(ledger)
        depth = GaugeMetricFamily(
            "clarion_queue_depth", "Messages waiting in each broker queue", labels=["queue"]
        )
        for queue, waiting, _ in (
            _BROKER.run(lambda: queue_depths(broker_url), s.metrics_db_timeout) or ()
        ):
            depth.add_metric([queue], waiting)
        yield depth


# The ledger's gauges: name, help, labels.
LEDGER_GAUGES = {
    "open": (
        "clarion_open_deliveries",
        "Deliveries not settled yet: pending, claimed (open claims), unknown (held)",
        ["lane", "channel", "state"],
    ),
    "oldest": (
        "clarion_oldest_due_seconds",
        "Age of the oldest row due for work, per kind and lane (stuck work)",
        ["kind", "lane"],
    ),
    "windows": (
        "clarion_digest_windows",
        "Digest windows not closed yet, per digest type and state (open, full)",
        ["digest_type", "state"],
    ),
    "buffered": (
        "clarion_digest_items",
        "Items buffered in digest windows not closed yet, per digest type",
        ["digest_type"],
    ),
    "chains": (
        "clarion_escalations_waiting",
        "Escalation chains waiting on a timer, per type and the step it is for",
        ["type", "step"],
    ),
    "planned": (
        "clarion_broadcast_planned",
        "Recipients a broadcast plans to request (running, or finished in the last hour)",
        ["broadcast", "type", "state"],
    ),
    "requested": (
        "clarion_broadcast_requested",
        "Recipients a broadcast has requested so far (its fan-out's progress)",
        ["broadcast", "type", "state"],
    ),
    "sent": (
        "clarion_broadcast_sent",
        "A broadcast's requests with a delivery the provider took",
        ["broadcast", "type", "state"],
    ),
    "waiting": (
        "clarion_broadcast_waiting",
        "A broadcast's requests not routed yet (pending, or deferred by a gate)",
        ["broadcast", "type", "state"],
    ),
    "suppressed": (
        "clarion_broadcast_suppressed",
        "A broadcast's requests not sent, by the first reason recorded for each",
        ["broadcast", "type", "reason"],
    ),
    "alerts": (
        "clarion_alerts_open",
        "Alerts firing (db.alerts: send_rate_drop per channel, stuck_work per kind and lane)",
        ["kind", "subject"],
    ),
}


def _ledger_families(ledger: dict[str, list[tuple[Any, ...]]]) -> Iterator[GaugeMetricFamily]:
    from prometheus_client.core import GaugeMetricFamily

    g = {
        key: GaugeMetricFamily(name, text, labels=labels)
        for key, (name, text, labels) in LEDGER_GAUGES.items()
    }
    for kind, subject in ledger["alerts"]:
        g["alerts"].add_metric([kind, subject], 1)
    for lane, channel, state, n in ledger["open"]:
        g["open"].add_metric([lane, channel, state], n)
    for kind, lane, age in ledger["oldest"]:
        g["oldest"].add_metric([kind, lane], age)
    items: dict[str, float] = {}
    for digest_type, state, n, count, _ in ledger["digests"]:
        if state != "closed":
            g["windows"].add_metric([digest_type, state], n)
            items[digest_type] = items.get(digest_type, 0) + count
    for digest_type, count in items.items():
        g["buffered"].add_metric([digest_type], count)
    for type_key, state, step, n, _ in ledger["escalations"]:
        if state == "waiting":
            g["chains"].add_metric([type_key, str(step)], n)
    for broadcast_id, type_key, state, *values in ledger["broadcasts"]:
        for key, value in zip(("planned", "requested", "sent", "waiting"), values, strict=True):
            g[key].add_metric([str(broadcast_id), type_key, state], value)
    for broadcast_id, type_key, reason, n in ledger["broadcast_reasons"]:
        g["suppressed"].add_metric([str(broadcast_id), type_key, reason], n)
    yield from g.values()
