"""The shared provider budgets (adapters.ratelimit) against the real Redis, from several processes."""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid

import kombu.pools
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from clarion.adapters.ratelimit import Quota, RateLimits
from clarion.errors import ThrottledError

pytestmark = pytest.mark.integration


@pytest.fixture
def limits(clarion_env) -> RateLimits:
    client = redis.Redis.from_url(clarion_env.redis_url)
    return RateLimits(lambda: client, prefix=f"test:{uuid.uuid4().hex}")


def spend(limits: RateLimits, quota: Quota, key: str, n: int, **kw) -> int:
    taken = 0
    for _ in range(n):
        try:
            limits.take(quota, key, **kw)
            taken += 1
        except ThrottledError:
            pass
    return taken


def test_a_budget_is_ninety_percent_of_every_window(limits):
    quota = Quota("p", ((10, 1.0), (15, 3.0)))
    assert quota.amounts(None) == [(9, 1), (13, 3)]
    assert spend(limits, quota, "cred", 20) == 9
    with pytest.raises(ThrottledError, match="budget_full") as full:
        limits.take(quota, "cred")
    assert 0 < full.value.retry_after <= 1.0
    assert spend(limits, quota, "other", 20) == 9  # per credential
    time.sleep(full.value.retry_after + 0.05)
    assert spend(limits, quota, "cred", 20) == 4  # the 3 s window holds: 13 in all


def test_cost_spends_segments_and_an_over_window_cost_is_refused(limits):
    quota = Quota("sms", ((10, 1.0),))
    limits.take(quota, "+15550001", cost=4)
    limits.take(quota, "+15550001", cost=4)
    with pytest.raises(ThrottledError, match="budget_full"):
        limits.take(quota, "+15550001", cost=4)  # 9 allowed, 8 spent
    limits.take(quota, "+15550001", cost=1)
    with pytest.raises(ThrottledError, match="over_budget"):
        limits.take(quota, "+15550002", cost=10)


def test_the_activation_lane_cannot_take_the_whole_credential(limits):
    quota = Quota("p", ((20, 1.0),))
    assert spend(limits, quota, "k", 30, lane="activation") == 9  # half of 18
    assert spend(limits, quota, "k", 30, lane="transactional") == 9  # the rest is still there


def test_a_pause_holds_every_key_holder_until_it_ends(limits):
    quota = Quota("p", ((100, 1.0),))
    limits.pause(quota, "k", 0.6)
    limits.pause(quota, "k", 0.1)  # never shortened
    with pytest.raises(ThrottledError, match="paused") as paused:
        limits.take(quota, "k")
    assert 0.4 < paused.value.retry_after <= 0.6
    limits.take(quota, "other")
    time.sleep(paused.value.retry_after + 0.05)
    limits.take(quota, "k")


def test_an_outage_fails_closed_unless_the_quota_fails_open():
    dead = redis.Redis(
        host="127.0.0.1", port=9, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    limits = RateLimits(lambda: dead)
    with pytest.raises(ThrottledError, match="budget_unavailable") as closed:
        limits.take(Quota("sms", ((1, 1.0),)), "k")
    assert closed.value.retry_after > 0
    limits.take(Quota("chat", ((1, 1.0),), fail_open=True), "k")


def _hammer(url: str, prefix: str, start: float, out) -> None:
    client = redis.Redis.from_url(url)
    limits = RateLimits(lambda: client, prefix=prefix)
    quota = Quota("shared", ((10, 1.0),), share=1.0)
    while time.time() < start:
        time.sleep(0.001)
    stamps = []
    while time.time() < start + 2.5:
        try:
            stamps.append(limits.take(quota, "one-credential"))  # when Redis charged it
        except ThrottledError as full:
            time.sleep(min(full.retry_after or 0.01, 0.05))
    out.put(stamps)
    out.close()
    out.join_thread()
    os._exit(0)  # no exit handlers: they would close broker connections shared with the parent


def test_four_processes_share_one_budget_and_no_second_holds_more(clarion_env):
    from clarion.tasks.app import app

    # A forked child drops the AMQP connections it inherits, resetting the parent's (DESIGN §7):
    # close them first, as tests/support/race.py does; the next publish reconnects.
    kombu.pools.reset()
    app._after_fork()
    prefix, start = f"test:{uuid.uuid4().hex}", time.time() + 0.5
    out: multiprocessing.Queue = multiprocessing.Queue()
    procs = [
        multiprocessing.get_context("fork").Process(
            target=_hammer, args=(clarion_env.redis_url, prefix, start, out)
        )
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    per_process = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    stamps = sorted(t for s in per_process for t in s)
    assert sum(1 for s in per_process if s) >= 3  # they contended
    assert 20 <= len(stamps) <= 30
    # any window of one second of Redis's clock holds at most 10 (a sliding window, not calendar
    # seconds); how a provider counts arrivals is the SMS acceptance test's to show
    assert max(sum(1 for u in stamps if t <= u < t + 1.0) for t in stamps) <= 10


def test_a_take_is_one_round_trip_pause_included(clarion_env):
    """The pause lives in the budget's hash slot, so the one script reads it: no GET beside it."""
    sent: list[str] = []

    class Counted(redis.Redis):  # the real client, counting the commands it sends
        def execute_command(self, *args, **options):
            sent.append(str(args[0]))
            return super().execute_command(*args, **options)

    client = Counted.from_url(clarion_env.redis_url)
    limits = RateLimits(lambda: client, prefix=f"test:{uuid.uuid4().hex}")
    quota = Quota("p", ((100, 1.0),))
    assert spend(limits, quota, "cred", 10) == 10
    assert sent == ["EVAL"] * 10
    limits.pause(quota, "cred", 5.0)
    sent.clear()
    with pytest.raises(ThrottledError, match="paused") as paused:
        limits.take(quota, "cred")
    assert sent == ["EVAL"] and 4.0 < paused.value.retry_after <= 5.0
