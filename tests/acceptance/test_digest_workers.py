"""Digests under real Celery workers and two beats: items stream in across many short windows
(2 s, or 6 items), and every digest request is routed by several worker processes at once.

Two activation workers (two processes each) route the items and the digests, a control worker runs
the ticks of two beat processes, and a forked process re-publishes the route task of every digest
request every 100 ms, so flushes race on different worker processes; each route holds its
transaction open 20 ms. Counted at the webhook receiver: every item in exactly one digest, no
digest twice. (The race around one boundary on the injected clock is test_digest_races.py.)

This test found a digest request routed before its window was closed (the close then ran before
resolve-once, and the tick made the request pending between the two statements); the close now
runs after resolve-once, in the same transaction.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from clarion import settings
from clarion.ops.stats import counters
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.publish import ROUTE, publish
from tests.support.cluster import Cluster, wait_settled
from tests.support.digests import DIGESTS, use_digest_catalog
from tests.support.gates import rows
from tests.support.race import race

# ~35 s on two loaded cores: make soak runs it; the default tier has test_digest_races.py.
pytestmark = [pytest.mark.acceptance, pytest.mark.soak]

USERS = [f"w{n}" for n in range(6)]
PRODUCERS, ITEMS_EACH = 3, 12
PACE = 0.04  # seconds between one producer's items
WORKERS = ("activation-1", "activation-2", "control")


@pytest.fixture
def cluster(clarion_env, monkeypatch, tmp_path: Path) -> Iterator[Receiver]:
    use_digest_catalog(monkeypatch)
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        env = {
            **clarion_env.env,
            "CLARION_CATALOG": str(DIGESTS),
            "CLARION_TICK_INTERVAL": "0.5",
            "CLARION_STRAY_AFTER": "20",
            "CLARION_BATCH_SIZE": "1",
            "CLARION_WEBHOOK_URL": receiver.url,
        }
        c = Cluster(env, tmp_path / "logs")
        hold = {"CLARION_FAULTS": "route.before_commit=sleep:0.02"}
        try:
            c.worker("activation-1", ["activation"], concurrency=2, env=hold)
            c.worker("activation-2", ["activation"], concurrency=2, env=hold)
            c.worker("control", ["control"], concurrency=1)
            c.beat("beat-1")
            c.beat("beat-2")
            c.wait_ready(WORKERS, 60)
            yield receiver
        finally:
            c.stop_together()


def _produce(i: int) -> int:
    """Producer i < PRODUCERS sends items; the last process keeps re-publishing digest routes."""
    if i == PRODUCERS:
        deadline = time.monotonic() + ITEMS_EACH * len(USERS) * PACE + 3
        republished = 0
        while time.monotonic() < deadline:
            digests = rows(
                "SELECT user_id, id, lane FROM requests WHERE occurrence_key LIKE 'digest:%' "
                "AND state <> 'routed'"
            )
            publish(ROUTE, digests)
            republished += len(digests)
            time.sleep(0.1)
        return republished
    for n in range(ITEMS_EACH):
        for user in USERS:
            notify(user, "quick_reply", event_id=f"{i}-{n}-{user}", variables={"seller": f"s{i}"})
            time.sleep(PACE)
    return 0


def test_every_item_reaches_the_receiver_in_exactly_one_digest(cluster):
    receiver = cluster
    for user in USERS:
        register_recipient(user, timezone="UTC")
    republished = race(PRODUCERS + 1, _produce, lambda i: (i,))
    assert wait_settled(30), "digests still open or undelivered"

    items = {i for (i,) in rows("SELECT id FROM requests WHERE type_key = 'quick_reply'")}
    assert len(items) == PRODUCERS * ITEMS_EACH * len(USERS)
    with receiver.arrivals.lock:
        contents = list(receiver.arrivals.contents.values())
    carried = Counter(int(i) for c in contents for i in c["items"].split())
    assert set(carried) == items, "an item is in no digest that arrived"
    assert max(carried.values()) == 1, "an item is in two digests"
    assert receiver.arrivals.repeats == 0
    digests = rows("SELECT count, closed_at IS NOT NULL FROM digests")
    assert all(closed for _, closed in digests) and len(digests) == len(contents)
    by_size = sum(1 for n, _ in digests if n == 6)
    assert by_size, "no digest flushed by size"
    lost = counters(settings.get().redis_url or settings.get().urls()[1]).get(
        "route_skipped_already_resolved", 0
    )
    assert lost > 0, "no second flusher ever met a flushed digest"
    print(
        f"\n{len(items)} items in {len(contents)} digests ({by_size} flushed full); "
        f"{sum(republished)} digest routes re-published, {lost} routes found the request resolved"
    )
