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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clarion.errors import ConfigurationError

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram

    SENDS: Counter
    SUPPRESSED: Counter
    INCIDENTS: Counter
    RECEIPTS: Counter
    EVENT_TO_SENT: Histogram
    EVENT_TO_DELIVERED: Histogram
    TICK_SECONDS: Histogram
    TICK_TAKEN: Counter
    FAILOVERS: Counter
    CIRCUIT: Gauge

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
    from prometheus_client import Counter, Gauge, Histogram

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
        "FAILOVERS": Counter(
            "clarion_provider_failovers",
            "Sends taken by a later provider because an earlier one certainly failed or its "
            "circuit was open (adapters/failover.py)",
            ["channel", "from_provider", "to_provider"],
        ),
        "CIRCUIT": Gauge(
            "clarion_provider_circuit_state",
            "A provider's circuit as last changed by any process here: 0 closed, 1 half-open, 2 open",
            ["channel", "provider"],
            multiprocess_mode="mostrecent",
        ),
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
    "FAILOVERS",
    "CIRCUIT",
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
