"""What the rig's soak tests share: a producer that retries like an app, waiting for the ledger
to settle, and the receiver-side verdict (lost, split, sent twice, repeats and their incidents)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import text

from clarion.ops import launch
from clarion.standins.receiver import Receiver
from clarion.tasks import notify_many
from tests.support.cluster import counts, occurrence
from tests.support.hosts import Rig


class Producer(threading.Thread):
    """The app: enqueues batches at a steady pace; a batch that raises is sent again as it is
    (same event ids) until it is acknowledged, as an app with a retry would."""

    def __init__(self, items: list[dict], batch: int, pause: float) -> None:
        super().__init__(daemon=True)
        self.items, self.batch, self.pause = items, batch, pause
        self.acknowledged: list[dict] = []
        self.errors = 0
        self.last_error = ""  # the most recent exception retried (shown in the report)
        self.found_on_retry = 0  # items of a failed attempt that had been written after all
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for start in range(0, len(self.items), self.batch):
                chunk = self.items[start : start + self.batch]
                retried = False
                while True:
                    try:
                        result = notify_many(chunk)
                        break
                    except Exception as exc:  # a service is failing over: the app retries
                        self.errors += 1
                        self.last_error = repr(exc)[:200]
                        retried = True
                        time.sleep(0.5)
                if retried:
                    self.found_on_retry += sum(not e.new for e in result)
                self.acknowledged.extend(chunk)
                time.sleep(self.pause)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def wait_settled(receiver: Receiver, expected: int, timeout: float) -> bool:
    """Every request routed, no delivery pending or claimed, `expected` occurrences arrived."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            open_rows = counts(
                "SELECT count(*) FROM deliveries WHERE state IN ('pending', 'claimed')"
            ) + counts("SELECT count(*) FROM requests WHERE state <> 'routed'")
        except Exception:  # noqa: BLE001 - the database may be settling after a fault
            open_rows = -1
        if open_rows == 0 and receiver.arrivals.unique >= expected:
            return True
        time.sleep(1)
    return False


def incidents() -> dict[str, set[int]]:
    """Delivery ids of each incident kind in the ledger."""
    from clarion.db.engine import engine

    found: dict[str, set[int]] = {}
    with engine().connect() as conn:
        for kind, delivery in conn.execute(text("SELECT kind, delivery_id FROM incidents")):
            found.setdefault(kind, set()).add(delivery)
    return found


def verdict(receiver: Receiver, acknowledged: list[dict]) -> dict[str, int]:
    """Assert, counted at the receiver: nothing acknowledged lost, no occurrence under two keys,
    no at-most-once nudge twice, every webhook repeat matched by a `repeat` incident and every
    such incident by a repeat. Returns the figures to report."""
    arrivals = receiver.arrivals
    expected = {occurrence(i) for i in acknowledged}
    assert set(arrivals.occurrences) == expected, (
        f"lost: {len(expected - set(arrivals.occurrences))}, "
        f"strangers: {len(set(arrivals.occurrences) - expected)}"
    )
    split = [o for o, keys in arrivals.occurrences.items() if len(keys) != 1]
    assert split == [], f"occurrences sent under two idempotency keys: {split[:5]}"
    key_of = {k: o for o, keys in arrivals.occurrences.items() for k in keys}
    twice = [k for k, n in arrivals.by_key.items() if n > 1 and "/nudge/" in key_of[k]]
    assert twice == [], f"at-most-once messages that arrived twice: {twice[:5]}"
    repeated = {arrivals.deliveries[k] for k, n in arrivals.by_key.items() if n > 1}
    found = incidents()
    assert repeated <= found.get("repeat", set()), "a webhook repeat with no incident"
    assert found.get("repeat", set()) <= repeated, "a repeat incident with no repeat"
    return {
        "arrivals": arrivals.total,
        "unique": arrivals.unique,
        "repeats": arrivals.repeats,
        **{f"incidents_{k}": len(v) for k, v in found.items()},
    }


def rates(receiver: Receiver, edges: list[float]) -> list[str]:
    """First arrivals per second between consecutive edges (perf_counter readings)."""
    times = list(receiver.arrivals.first_at.values())
    return [
        f"{sum(a <= t < b for t in times) / max(b - a, 1e-9):.1f}"
        for a, b in zip(edges, edges[1:], strict=False)
    ]


def start_fleet(rig: Rig, workers: tuple[str, ...], home: Path, logs: Path) -> None:
    """A worker for every lane on each worker host, and beat on the first two (the tick is safe
    twice, and one beat survives a host); logs in `logs`, one per process."""
    logs.mkdir(exist_ok=True)
    for name in workers:
        rig.start(
            name,
            launch.worker_command(launch.QUEUES, concurrency=2, name=name, loglevel="INFO"),
            log=logs / f"{name}.log",
        )
    for name in workers[:2]:
        beat_home = home / f"beat-{name}"
        beat_home.mkdir(parents=True)
        rig.start(name, launch.beat_command(beat_home), log=logs / f"beat-{name}.log")
