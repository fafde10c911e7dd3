"""A broker failover mid-run, on separate hosts (tests/support/hosts.py): Redis Sentinel's master,
replica and three sentinels on three broker hosts (tests/support/redisha.py), PostgreSQL on a
database host, clarion workers and two beats on three worker hosts, the webhook receiver on a
receiver host. clarion's broker and its own Redis are both the sentinel:// URL. The master's host
is cut off and killed while notifications flow; counted at the receiver."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from clarion.db.engine import migrate
from clarion.ops import launch
from clarion.standins.receiver import Receiver
from clarion.tasks import register_recipient, runtime
from tests.support.cluster import mixed_requests
from tests.support.environment import use_only
from tests.support.hostdb import start_postgres
from tests.support.hosts import Rig, unavailable
from tests.support.redisha import SENTINEL, SentinelRedis
from tests.support.soak import (
    Producer,
    rates,
    receiver_on,
    soak_env,
    start_fleet,
    verdict,
    wait_settled,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.soak]

WORKERS = ("w1", "w2", "w3")
BROKERS = ("broker1", "broker2", "broker3")
HOSTS = ("db", *BROKERS, *WORKERS, "receiver")
USERS, PER_USER = 200, 10  # 2,000 occurrences, half transactional (at least once), half activation


def test_a_broker_failover_mid_run_loses_nothing_and_sends_nothing_twice(tmp_path, monkeypatch):
    reason = unavailable()
    assert reason is None, reason  # the soak tier installs what it needs (make hosts-deps)
    assert Path("/usr/bin/redis-sentinel").exists(), "run `make hosts-deps` (redis-sentinel)"
    folder = Path(f"/tmp/clarion-broker-ha-{os.getpid()}")  # PostgreSQL's data: its own user's
    try:
        with Rig(tmp_path / "rig", HOSTS) as rig:
            _run(rig, folder, tmp_path, monkeypatch)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(rig: Rig, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = start_postgres(rig, "db", folder / "db")
    ha = SentinelRedis(rig, tmp_path / "redis", hosts=BROKERS)
    ha.start()
    env = soak_env(tmp_path / "home", url, ha.url, extra=SENTINEL)
    with receiver_on(rig) as receiver:
        env["CLARION_WEBHOOK_URL"] = receiver.url
        use_only(monkeypatch, env)
        migrate(url)
        for u in range(USERS):
            register_recipient(f"u{u}", timezone="Europe/Berlin")
        start_fleet(rig, WORKERS, tmp_path / "home", tmp_path / "logs")
        items = mixed_requests(USERS, PER_USER)
        producer = Producer(items, batch=20, pause=0.4)  # 2,000 over ~60 s at least
        began = time.perf_counter()
        producer.start()
        assert launch.wait_until(lambda: receiver.arrivals.unique >= 200, 180), "nothing arrived"
        before = receiver.arrivals.unique
        old = ha.master()
        assert old == BROKERS[0]
        runtime.redis().hset("clarion:probe", "before", "1")  # clarion's own Redis: the master
        rig.cut(old)  # the master's host drops off: connections to it hang, nothing answers
        cut_at = time.perf_counter()
        time.sleep(1)
        rig.kill(old)  # and it dies, its sentinel with it (two of three remain: a majority)
        new = ha.wait_master(other_than=old)
        promoted_at = time.perf_counter()
        resumed = launch.wait_until(
            lambda: receiver.arrivals.unique > _last(receiver, promoted_at), 120
        )
        resumed_at = time.perf_counter()
        runtime.reset()  # a fresh client asks the sentinels: it reaches the promoted master
        assert runtime.redis().ping()
        producer.join(600)
        assert producer.error is None, producer.error
        assert not producer.is_alive(), "the producer never finished"
        settled = wait_settled(receiver, len(items), 300)
        for name in WORKERS:
            rig.kill(name)
    assert settled, f"not every occurrence arrived: {receiver.arrivals.unique} of {len(items)}"
    assert resumed, "no arrival after the failover"
    assert len(producer.acknowledged) == len(items)
    figures = verdict(receiver, producer.acknowledged)
    phases = rates(
        receiver.arrivals.first_at.values(),
        [began, cut_at, promoted_at, max(receiver.arrivals.first_at.values())],
    )
    print(
        f"\narrivals/s before, during and after the broker failover: {phases}"
        f"\nbroker failover: {old} -> {new}: new master named and answering "
        f"{promoted_at - cut_at:.1f} s after the cut; first arrival after the promotion "
        f"{resumed_at - cut_at:.1f} s after the cut; arrived before the cut {before}; "
        f"producer errors {producer.errors} (last: {producer.last_error}); {figures}"
    )


def _last(receiver: Receiver, at: float) -> int:
    """Occurrences that had arrived by perf_counter() reading `at` (a first arrival after the
    fault is one more than this)."""
    return sum(t <= at for t in receiver.arrivals.first_at.values())
