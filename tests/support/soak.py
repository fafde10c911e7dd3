"""What the rig's soak tests share: their environment, the receiver on its host, a fleet of
workers and beats on the worker hosts, a producer that retries like an app, waiting for the ledger
to settle, and the receiver-side verdict (lost, split, sent twice, repeats and their incidents)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from sqlalchemy import text

from clarion.ops import launch
from clarion.records import idempotency_key
from clarion.standins.fake_slack import FakeSlack
from clarion.standins.receiver import Receiver
from clarion.tasks import notify_many
from tests.support.cluster import children, counts, occurrence
from tests.support.environment import CATALOG, WEBHOOK_SECRET
from tests.support.hosts import Rig

# A dead host answers nothing: without these a connection to it waits for TCP's own timeouts
# (minutes); with them, a lost primary costs a client seconds (docs/beyond-one-machine.md).
LIBPQ_TIMEOUTS = "connect_timeout=3&keepalives_idle=2&keepalives_interval=1&keepalives_count=3&tcp_user_timeout=6000"
FAST = {
    "CLARION_CLAIM_LEASE": "20",
    "CLARION_STRAY_AFTER": "5",
    "CLARION_BATCH_SIZE": "50",
    "CLARION_TICK_INTERVAL": "0.5",
    "CLARION_START_WAIT": "120",
}


def soak_env(
    home: Path,
    database_url: str,
    redis_url: str,
    catalog: Path = CATALOG,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The CLARION_* settings of a soak run: one Redis for broker and clarion, the test
    catalog, the short timings of FAST, and `extra` on top."""
    return {
        "CLARION_HOME": str(home),
        "CLARION_DATABASE_URL": database_url,
        "CLARION_REDIS_URL": redis_url,
        "CLARION_BROKER_URL": redis_url,
        "CLARION_CATALOG": str(catalog),
        "CLARION_WEBHOOK_SECRET": WEBHOOK_SECRET,
        **FAST,
        **(extra or {}),
    }


def receiver_on(rig: Rig, host: str = "receiver") -> Receiver:
    """The webhook receiver serving on `host`'s address (its socket in that host's network)."""
    with rig.inside(host):
        return Receiver(WEBHOOK_SECRET, host=rig.address(host))


class Producer(threading.Thread):
    """The app: enqueues batches at a steady pace; a batch that raises is sent again as it is
    (same event ids) until it is acknowledged, as an app with a retry would. `items` may be
    endless: `stop()` ends the run after the batch in hand."""

    def __init__(self, items: Iterable[dict], batch: int, pause: float) -> None:
        super().__init__(daemon=True)
        self.items, self.batch, self.pause = iter(items), batch, pause
        self.acknowledged: list[dict] = []
        self.errors = 0
        self.last_error = ""  # the most recent exception retried (shown in the report)
        self.found_on_retry = 0  # items of a failed attempt that had been written after all
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                chunk = list(itertools.islice(self.items, self.batch))
                if not chunk:
                    return
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
                self._halt.wait(self.pause)
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
    every webhook repeat matched by a `repeat` incident and every such incident by a repeat.
    Returns the figures to report. An at-most-once type, too, may arrive twice under its one key:
    the webhook's receiver dedups by key, so a takeover or an unknown outcome sends it again under
    the key (tasks/send/sequence.py, docs/guarantees.md) and the receiver drops the repeat (409,
    a `repeat` incident): accepted once. Where a repeat would reach the person (Slack), the
    check is stricter: `slack_verdict`."""
    arrivals = receiver.arrivals
    expected = {occurrence(i) for i in acknowledged}
    assert set(arrivals.occurrences) == expected, (
        f"lost: {len(expected - set(arrivals.occurrences))}, "
        f"strangers: {len(set(arrivals.occurrences) - expected)}"
    )
    split = [o for o, keys in arrivals.occurrences.items() if len(keys) != 1]
    assert split == [], f"occurrences sent under two idempotency keys: {split[:5]}"
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


def rates(times: Iterable[float], edges: list[float]) -> list[str]:
    """Arrivals per second between consecutive edges (perf_counter readings of each arrival and
    edge; `receiver.arrivals.first_at.values()`: each key's first)."""
    times = list(times)
    return [
        f"{sum(a <= t < b for t in times) / max(b - a, 1e-9):.1f}"
        for a, b in zip(edges, edges[1:], strict=False)
    ]


def start_fleet(
    rig: Rig,
    workers: tuple[str, ...],
    home: Path,
    logs: Path,
    *,
    supervised: bool = False,
    clock: bool = False,
) -> None:
    """A worker for every lane on each worker host, and beat on the first two (the tick is safe
    twice, and one beat survives a host); logs in `logs`, one per process. `supervised`: each
    worker as `clarion worker` runs it (restarted by its supervisor when it dies); `clock`: on
    the host's clock, which `rig.skew` moves."""
    logs.mkdir(exist_ok=True)
    for name in workers:
        if supervised:
            clarion = str(Path(sys.executable).with_name("clarion"))
            command = [clarion, "worker", "-c", "2", "--name", name, "--loglevel", "INFO"]
        else:
            command = launch.worker_command(
                launch.QUEUES, concurrency=2, name=name, loglevel="INFO"
            )
        rig.start(name, command, log=logs / f"{name}.log", clock=clock)
    for name in workers[:2]:
        beat_home = home / f"beat-{name}"
        beat_home.mkdir(parents=True)
        rig.start(name, launch.beat_command(beat_home), log=logs / f"beat-{name}.log", clock=clock)


def kill_worker(rig: Rig, host: str) -> list[int]:
    """SIGKILL the Celery worker that a supervisor (`start_fleet(supervised=True)`) runs on
    `host`, as the kernel's OOM killer would: its supervisor starts it again. The PIDs killed."""
    return _signal(_celery_workers(rig, host), signal.SIGKILL)


def dump_stacks(rig: Rig, host: str) -> list[int]:
    """SIGUSR2 to each pool process of the Celery worker on `host`: every thread's stack goes to
    the worker's log (tasks/app.py). The PIDs asked."""
    pool = [child for worker in _celery_workers(rig, host) for child in children(worker)]
    return _signal(pool, signal.SIGUSR2)


def _celery_workers(rig: Rig, host: str) -> list[int]:
    """The Celery worker processes (main processes) the supervisors on `host` run."""
    return [
        child
        for process in rig.processes[host]
        if "worker" in process.command and process.alive()
        for child in children(process.popen.pid)
    ]


def _signal(pids: list[int], sig: signal.Signals) -> list[int]:
    """`sig` to each of `pids` still there; the ones it reached."""
    reached = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            reached.append(pid)
    return reached


def slack_verdict(slack: FakeSlack, acknowledged: list[dict]) -> dict[str, int]:
    """Assert, counted at the Slack stand-in: every acknowledged Slack occurrence posted, none
    posted twice (Slack has no idempotency key: an unknown send is settled by looking for the
    message's metadata first), no stranger. `acknowledged` are the Slack items alone. Returns
    the figures to report."""
    expected = {
        idempotency_key(i["user_id"], i["type_key"], f"event:{i['event_id']}", "slack")
        for i in acknowledged
    }
    posts = [(p.metadata or {}).get("event_payload", {}) for p in slack.posts()]
    posted = Counter(str(p.get("idempotency_key")) for p in posts)
    assert set(posted) == expected, (
        f"slack lost: {len(expected - set(posted))}, strangers: {len(set(posted) - expected)}"
    )
    twice = [k for k, n in posted.items() if n > 1]
    assert twice == [], f"Slack messages posted twice: {twice[:5]}"
    return {"slack_posts": len(posts)}


def slack_times(slack: FakeSlack) -> list[float]:
    """perf_counter() of each Slack post (for `rates`)."""
    return [p.at for p in slack.posts()]
