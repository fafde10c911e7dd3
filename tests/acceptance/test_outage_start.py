"""`clarion worker` started, and restarted by its supervisor, while the broker (then the database)
is down for 30 s comes up by itself when it returns, with no operator, and every notification
arrives exactly once at the webhook receiver (issue 23 item 7).

Real processes all the way: a PostgreSQL and a Redis of the test's own (stopped and started for
real), `clarion worker` and `clarion beat` started with the documented production variables
(docs/operations/index.md) and a short CLARION_START_WAIT so the supervisor's restart path runs
during the outage. The only fixed wait is the outage itself; everything else polls with a
deadline. Marked `soak`: about two minutes.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from clarion.db.engine import engine
from clarion.ops import launch
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from tests.support import services
from tests.support.environment import ROOT, WEBHOOK_SECRET

pytestmark = [pytest.mark.acceptance, pytest.mark.soak]

CLARION = Path(sys.executable).parent / "clarion"
CATALOG = Path(__file__).parents[1] / "catalog_outcomes.yaml"
OUTAGE = 30.0  # seconds the service stays down
START_WAIT = 10.0  # CLARION_START_WAIT: a starting worker gives up (exit 75) within the outage
USERS = 4
RESTARTED = "worker exited with 75; restarting in"  # ops/launch.py's line for an UNAVAILABLE exit
GAVE_UP = "clarion: worker not ready, giving up for now"  # tasks/app.py's line before exit 75
ARRIVAL_DEADLINE = 120.0  # after the service returns (a loaded 2-core machine boots Celery slowly)
PRODUCTION = ROOT / "docs" / "operations" / "index.md"  # "Running it in production"


def documented_variables() -> set[str]:
    """The CLARION_* variables the production page's `export` lines set."""
    exports = [line for line in PRODUCTION.read_text().splitlines() if line.startswith("export ")]
    return {name for line in exports for name in re.findall(r"\b(CLARION_[A-Z_]+)=", line)}


@pytest.fixture
def own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[services.Own]:
    with services.own_services(
        tmp_path, monkeypatch, "outage", {"CLARION_CATALOG": str(CATALOG)}
    ) as own:
        monkeypatch.delenv("CLARION_BROKER_URL")  # the documented deployment names only the Redis
        yield own


@pytest.fixture
def receiver(own: services.Own) -> Iterator[Receiver]:
    """The webhook's far end, and the recipients the notifications go to."""
    for u in range(USERS):
        register_recipient(f"u{u}", timezone="UTC")
    with Receiver(WEBHOOK_SECRET) as receiver:
        yield receiver


class Deployment:
    """`clarion worker` (all lanes) and `clarion beat`, started as an operator starts them."""

    def __init__(self, receiver: Receiver, folder: Path) -> None:
        # the documented production variables (docs/operations/index.md: the database, the Redis,
        # the catalog, the webhook secret) and a home folder are this process's CLARION_* (the
        # `own` fixture set them, and nothing else of ours), plus where webhooks go and the wait
        assert {k for k in os.environ if k.startswith("CLARION_")} == documented_variables() | {
            "CLARION_HOME"
        }
        self.env = {"CLARION_WEBHOOK_URL": receiver.url, "CLARION_START_WAIT": f"{START_WAIT:g}"}
        self.worker_log, self.beat_log = folder / "worker.log", folder / "beat.log"
        self.worker = launch.Process(
            [str(CLARION), "worker", "-c", "2"], env=self.env, log=self.worker_log
        )
        self.beat = launch.Process([str(CLARION), "beat"], env=self.env, log=self.beat_log)

    def worker_said(self) -> str:
        return self.worker_log.read_text(errors="replace")

    def stop(self) -> None:
        self.worker.stop(timeout=30)
        self.beat.stop(timeout=10)


def _notify_all() -> set[str]:
    """One receipt per user; the occurrences the receiver must see, each exactly once."""
    expected = set()
    for u in range(USERS):
        enqueued = notify(f"u{u}", "receipt_webhook", event_id=f"outage-{u}")
        assert enqueued.new and enqueued.request_id > 0
        expected.add(f"u{u}/receipt_webhook/event:outage-{u}")
    return expected


def _until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `predicate` until true; the perf_counter() at which it was seen true."""
    assert launch.wait_until(predicate, timeout, 0.05), f"{what} within {timeout:g} s"
    return time.perf_counter()


def _states() -> dict[str, int]:
    with engine().connect() as conn:
        rows = conn.execute(text("SELECT state, count(*) FROM deliveries GROUP BY 1")).all()
    return {state: n for state, n in rows}


def _start_during_outage(
    receiver: Receiver,
    folder: Path,
    expected: set[str],
    down_since: float,
    bring_back: Callable[[], None],
) -> tuple[float, float]:
    """Start the deployment while a service is down (since `down_since`), keep it down OUTAGE
    seconds in all, bring it back; (seconds to the worker's ready, to the last arrival)."""
    deployment = Deployment(receiver, folder)
    try:
        _outage(down_since, deployment)
        assert receiver.arrivals.by_key == {}
        bring_back()
        back = time.perf_counter()
        return _comes_up_and_delivers_once(deployment, receiver, expected, back)
    finally:
        deployment.stop()


def _outage(down_since: float, deployment: Deployment) -> None:
    """Keep the service down for OUTAGE seconds in all; the worker must have given up and been
    restarted by its supervisor at least once by then, and nothing may have arrived."""
    _until(
        lambda: RESTARTED in deployment.worker_said(),
        down_since + OUTAGE - time.perf_counter(),
        "the supervisor did not restart the waiting worker during the outage",
    )
    time.sleep(max(0.0, down_since + OUTAGE - time.perf_counter()))  # the outage itself
    assert deployment.worker.alive(), deployment.worker_said()


def _comes_up_and_delivers_once(
    deployment: Deployment, receiver: Receiver, expected: set[str], back: float
) -> tuple[float, float]:
    """After the service returned at `back`: the worker says ready and every occurrence arrives
    exactly once. Returns (seconds to ready, seconds to the last arrival)."""
    ready = _until(
        lambda: " ready." in deployment.worker_said(),
        ARRIVAL_DEADLINE,
        f"the worker did not come up by itself\n{deployment.worker_said()}",
    )
    arrivals = receiver.arrivals
    _until(
        lambda: set(arrivals.occurrences) == expected,
        ARRIVAL_DEADLINE - (ready - back),
        f"not every notification arrived: {sorted(arrivals.occurrences)}",
    )
    last = max(arrivals.first_at.values())
    said = deployment.worker_said()
    assert deployment.worker.alive(), said
    assert said.count(GAVE_UP) >= 1, said
    assert "refused to start" not in said and "not restarting" not in said, said
    assert "Traceback" not in said, said
    assert [o for o, keys in arrivals.occurrences.items() if len(keys) != 1] == []
    assert sorted(arrivals.by_key.values()) == [1] * len(expected), arrivals.by_key
    # "sent" is written by the batch's flusher after the provider answered (tasks/send/group.py):
    # the receiver can see the last arrival a moment before its row says so
    _until(lambda: _states() == {"sent": len(expected)}, 30, f"not all sent: {_states()}")
    return ready - back, last - back


def test_a_worker_started_while_the_broker_is_down_comes_up_when_it_returns(
    own: services.Own, receiver: Receiver, tmp_path: Path
) -> None:
    redis_server = own[2]
    redis_server.stop()
    down_since = time.perf_counter()
    expected = _notify_all()  # committed; the publish fails fast, the beat tick publishes
    ready, delivered = _start_during_outage(
        receiver, tmp_path, expected, down_since, redis_server.start
    )
    print(f"\nbroker back: worker ready after {ready:.1f} s, all delivered after {delivered:.1f} s")


def test_a_worker_started_while_the_database_is_down_comes_up_when_it_returns(
    own: services.Own, receiver: Receiver, tmp_path: Path
) -> None:
    postgres = own[1]
    expected = _notify_all()  # committed and published: the route tasks wait in Redis
    engine().dispose()
    services.stop_postgres(postgres)
    down_since = time.perf_counter()
    ready, delivered = _start_during_outage(
        receiver, tmp_path, expected, down_since, lambda: services.start_postgres(postgres)
    )
    print(
        f"\ndatabase back: worker ready after {ready:.1f} s, all delivered after {delivered:.1f} s"
    )
