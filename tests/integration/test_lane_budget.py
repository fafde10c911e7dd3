"""The activation lane's send budget (tasks/lanes.py) against real Redis, PostgreSQL and the webhook
receiver: reservations are shared by every process, a budgeted lane's sends are spread at the
receiver, rows already done are never charged, and the transactional lane is never paced."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from clarion import settings
from clarion.records import idempotency_key
from clarion.standins.receiver import Receiver
from clarion.tasks import lanes, notify_many, register_recipient, runtime
from clarion.tasks.route import route
from tests.support.pipeline import configure, count, drain, publishing_to_this_tests_broker
from tests.support.race import race

pytestmark = pytest.mark.integration


@pytest.fixture
def receiver(clarion_env, monkeypatch) -> Iterator[Receiver]:
    with publishing_to_this_tests_broker(), Receiver(settings.get().webhook_secret) as running:
        configure(monkeypatch, webhook_url=running.url, activation_per_second=40)
        yield running


def _tat() -> bytes | None:
    return runtime.redis().get(lanes.KEY.format(lane="activation"))  # type: ignore[return-value]


def _redis_now() -> int:
    """Redis's clock (µs): the clock the reservation script reads."""
    seconds, micros = runtime.redis().time()
    return seconds * 1_000_000 + micros


def test_reservations_queue_up_at_the_rate(clarion_env):
    """Read on Redis's own clock, bracketing each reservation: no guessed slack for a busy box."""
    step, burst = 100_000, int(lanes.BURST * 1_000_000)  # 10 rows at 100/s: 0.1 s of budget
    tats: list[int] = []
    for k in range(5):
        before = _redis_now()
        wait = round(lanes.reserve("activation", 10, 100.0) * 1_000_000)
        after = _redis_now()
        tats.append(int(_tat()))
        # each reservation queues behind the last (or starts at now, had the budget gone idle)
        if k == 0 or tats[k] - step != tats[k - 1]:
            assert before <= tats[k] - step <= after, (k, tats)
        # and waits until its rows' turn, less the burst an idle lane may spend at once
        assert max(0, tats[k] - after - burst) <= wait <= max(0, tats[k] - before - burst), k
        if k == 0:
            assert wait == 0  # the first fits the burst


def test_processes_share_one_budget(clarion_env):
    """Four processes reserving at once: together they push the lane's budget on by every row
    (a lost update between them would let some rows go early)."""
    start = _redis_now() + 100_000_000  # a busy lane, 100 s behind: it never goes idle here
    runtime.redis().set(lanes.KEY.format(lane="activation"), start, px=200_000)

    def reserve_all(_: int) -> int:
        return sum(lanes.reserve("activation", 1, 4000.0) > 0 for _ in range(2000))

    waited = race(4, reserve_all, lambda i: (i,))
    assert waited.most_at_once() == 4  # all four were reserving at once
    assert waited == [2000] * 4  # every row waits its turn behind the busy lane
    # 8,000 rows at 4,000/s (250 µs each): exactly 2 s of budget, to the microsecond
    assert int(_tat()) - start == 8000 * 250


def test_an_unbudgeted_lane_is_never_charged(clarion_env, monkeypatch):
    configure(monkeypatch, activation_per_second=10)
    assert lanes.wait_turn("transactional", 500, sleep=pytest.fail) == 0.0
    assert lanes.slices("transactional", [("u", i) for i in range(250)]) == [
        [("u", i) for i in range(250)]
    ]
    assert _tat() is None


def _nudges(n: int, first: int = 0) -> list[tuple[str, int]]:
    register_recipient("ann", timezone="UTC")
    made = notify_many(
        [
            dict(user_id="ann", type_key="nudge", event_id=f"n{i}", variables={"name": "Ann"})
            for i in range(first, first + n)
        ]
    )
    drain("activation")  # what notify published; the tests route by hand
    return [("ann", m.request_id) for m in made]


def _route(keys: list[tuple[str, int]], queue: str) -> float:
    began = time.monotonic()
    result = route.apply(args=[[k[0] for k in keys], [k[1] for k in keys]], routing_key=queue)
    assert result.successful(), result.traceback
    return time.monotonic() - began


def test_an_activation_batch_is_routed_and_sent_in_slices_at_the_rate(receiver):
    keys = _nudges(40)
    # 40 requests at 40/s, in slices of 4 (0.1 s of budget each), each slice sent by the route
    # task itself: the last slice goes 0.9 s after the first, and no deliver message is queued
    assert _route(keys, "activation") >= 0.85
    assert drain("activation") == []
    expected = {idempotency_key("ann", "nudge", f"event:n{i}", "webhook") for i in range(40)}
    first = receiver.arrivals.first_at
    assert set(first) == expected and receiver.arrivals.repeats == 0
    arrived = sorted(first.values())
    # (the first slice's own route and send may take longer than the last's: 0.15 s of slack)
    assert arrived[-1] - arrived[0] >= 0.75, arrived[-1] - arrived[0]
    # The same message again (redelivered): every request is done, nothing is charged or sent
    tat = _tat()
    _route(keys, "activation")
    assert _tat() == tat  # nothing reserved, so nothing waited for
    assert drain("activation") == [] and len(first) == 40 and receiver.arrivals.repeats == 0


def test_requests_from_an_unbudgeted_queue_are_routed_at_once(receiver):
    """The budget follows the queue the message came from; route called without one (a test, a
    script) is not paced either."""
    keys = _nudges(40)
    # not paced: routed and sent by the route task itself, nothing reserved or published
    _route(keys, "transactional")
    assert _tat() is None
    assert drain("activation") == []
    assert len(receiver.arrivals.first_at) == 40
    more = _nudges(40, first=40)
    route([k[0] for k in more], [k[1] for k in more])
    assert drain("activation") == []
    expected = {idempotency_key("ann", "nudge", f"event:n{i}", "webhook") for i in range(80)}
    assert set(receiver.arrivals.first_at) == expected and receiver.arrivals.repeats == 0
    assert count("deliveries", "state = 'sent' AND attempts = 1") == 80
    assert _tat() is None
