"""Prometheus metrics, counted by every clarion process on a host and summed by one scrape.

Every process that counts (worker pool children, the beat tick, `clarion web` taking receipts)
writes to prometheus_client's multiprocess files in one folder per host, and `/metrics` sums them.
The folder is `PROMETHEUS_MULTIPROC_DIR` if set, else `$CLARION_HOME/metrics`.

prometheus_client picks its value class (process-private or a file in the folder) once, when
`prometheus_client.values` is first imported, from `PROMETHEUS_MULTIPROC_DIR`. The `celery`
command imports it before any clarion module (Flower's CLI plugin), so choosing the folder at our
import comes too late. Instead clarion's metrics are created on first use, after `setup()` has
chosen the folder, exported it to children, and made `prometheus_client.values.ValueClass` the
multiprocess one if it was not already. `check()` (run at worker, beat and web start) refuses a
process whose clarion metrics would still count in private memory.

What the ledger already knows (open claims, unknown outcomes, queue depths, the oldest due row) is
read at scrape time by `LedgerCollector`, bounded by CLARION_METRICS_DB_TIMEOUT: a database that
is down or hangs gives `clarion_database_up 0` and the counters, never an error or a hung scrape.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from clarion.errors import ConfigurationError

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily

    SENDS: Counter
    SUPPRESSED: Counter
    INCIDENTS: Counter
    RECEIPTS: Counter
    EVENT_TO_SENT: Histogram
    EVENT_TO_DELIVERED: Histogram
    TICK_SECONDS: Histogram
    TICK_TAKEN: Counter

ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own variable, read where it reads it
# Latency buckets from a second (a send) to a day (a quiet-hours deferral).
LATENCY = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400)
log = logging.getLogger("clarion.metrics")
_lock = threading.Lock()
_folder: str | None = None
_metrics: dict[str, Any] = {}


def setup() -> str:
    """Choose this host's folder and make every metric created from now on count in it; the
    folder. Idempotent; safe whichever module imported prometheus_client first."""
    global _folder
    with _lock:
        if _folder is None:
            from clarion import settings

            chosen = os.environ.get(ENV) or str(settings.get().home.resolve() / "metrics")
            Path(chosen).mkdir(parents=True, exist_ok=True)
            os.environ[ENV] = chosen  # read by prometheus_client per value, and by child processes
            from prometheus_client import values

            if not getattr(values.ValueClass, "_multiprocess", False):
                values.ValueClass = values.MultiProcessValue()
            _folder = chosen
        return _folder


def folder() -> str:
    return setup()


def _create() -> dict[str, Any]:
    from prometheus_client import Counter, Histogram

    return {
        "SENDS": Counter(
            "clarion_sends",
            "Provider calls by outcome: sent, failed, retry, unknown, deferred (attempt refunded)",
            ["lane", "channel", "outcome"],
        ),
        "SUPPRESSED": Counter(
            "clarion_suppressed",
            "Requests or channels not sent, by gate and reason",
            ["gate", "reason"],
        ),
        "INCIDENTS": Counter("clarion_incidents", "Incidents recorded, by kind", ["kind"]),
        "RECEIPTS": Counter(
            "clarion_receipts",
            "Provider receipts by channel, event and outcome",
            ["channel", "event", "outcome"],
        ),
        "EVENT_TO_SENT": Histogram(
            "clarion_event_to_sent_seconds",
            "From notify() to the provider taking the message",
            ["lane", "channel"],
            buckets=LATENCY,
        ),
        "EVENT_TO_DELIVERED": Histogram(
            "clarion_event_to_delivered_seconds",
            "From notify() to the provider's delivered receipt",
            ["channel"],
            buckets=LATENCY,
        ),
        "TICK_SECONDS": Histogram(
            "clarion_tick_seconds",
            "Duration of one beat tick",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 5),
        ),
        "TICK_TAKEN": Counter("clarion_tick_taken", "Rows the tick published or fired", ["kind"]),
    }


NAMES = (
    "SENDS",
    "SUPPRESSED",
    "INCIDENTS",
    "RECEIPTS",
    "EVENT_TO_SENT",
    "EVENT_TO_DELIVERED",
    "TICK_SECONDS",
    "TICK_TAKEN",
)


def __getattr__(name: str) -> Any:
    """`metrics.SENDS` and the rest: created on first use, after setup() chose the folder."""
    if name not in NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    setup()
    with _lock:
        if not _metrics:
            _metrics.update(_create())
    return _metrics[name]


def check() -> None:
    """Raise ConfigurationError unless this process's clarion metrics count in the folder the
    scrape reads: prometheus_client's value class is the multiprocess one and this process's
    file for the (unlabelled) tick histogram is in that folder."""
    chosen = setup()
    from prometheus_client import values

    for value in _values(__getattr__("TICK_SECONDS")):
        # a read opens this process's file: after a fork, prometheus_client moves a value to the
        # child's own file only when it is next used
        getattr(value, "get", lambda: None)()
    private = [
        name
        for name, metric in _metrics.items()
        if not all(getattr(v, "_multiprocess", False) for v in _values(metric))
    ]
    mine = Path(chosen) / f"histogram_{os.getpid()}.db"
    problem = None
    if not getattr(values.ValueClass, "_multiprocess", False) or private:
        problem = f"clarion's metrics {private or list(NAMES)} count in process-private memory"
    elif os.environ.get(ENV) != chosen:
        problem = f"{ENV}={os.environ.get(ENV)!r} but clarion's metrics count in {chosen}"
    elif not mine.exists():
        problem = f"this process writes no metrics file in {chosen}"
    if problem:
        raise ConfigurationError(f"{problem}, so /metrics would not see them (clarion/metrics.py)")


def _values(metric: Any) -> Iterator[object]:
    """The value objects behind a metric: its own (unlabelled) or each labelled child's."""
    children = list(getattr(metric, "_metrics", {}).values()) or [metric]
    for child in children:
        for attr in ("_value", "_sum"):
            if hasattr(child, attr):
                yield getattr(child, attr)


def count_decisions(decisions: Iterable[tuple[str, str, str]]) -> None:
    """clarion_suppressed_total for decisions just recorded, as (gate, outcome, reason): every
    one that is not an `allow` (what `clarion explain` lists as why not, or not yet)."""
    for gate, outcome, reason in decisions:
        if outcome != "allow":
            __getattr__("SUPPRESSED").labels(gate, reason).inc()


def process_exited(pid: int) -> None:
    """Merge a finished process's live gauges away (its counters stay in the sums)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, setup())


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
    multiprocess.MultiProcessCollector(registry, path=setup())
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
    from clarion.db.engine import normalise_url, use_schema

    eng = create_engine(
        normalise_url(url),
        poolclass=NullPool,
        connect_args={
            "connect_timeout": max(1, round(timeout)),
            "options": f"-c statement_timeout={int(timeout * 1000)}",
        },
    )
    use_schema(eng, settings.get().schema)  # the ledger's tables are in clarion's schema
    return eng


def _read_ledger(url: str, timeout: float) -> dict[str, list[tuple[Any, ...]]]:
    from clarion import clock
    from clarion.db import reports
    from clarion.db.alerts import open_alerts

    eng = _ledger_engine(url, timeout)
    try:
        with eng.connect() as conn:
            return {
                "alerts": [(a.kind, a.subject) for a in open_alerts(conn)],
                "open": [tuple(r) for r in reports.open_deliveries(conn)],
                "oldest": [tuple(r) for r in reports.oldest_due(conn, clock.now())],
                "digests": [tuple(r) for r in reports.digest_counts(conn)],
                "escalations": [tuple(r) for r in reports.escalation_counts(conn)],
            }
    finally:
        eng.dispose()


class LedgerCollector:
    """`clarion_database_up`, and gauges read from PostgreSQL and the broker at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        from clarion import settings
        from clarion.ops.stats import queue_depths

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
    yield from g.values()
