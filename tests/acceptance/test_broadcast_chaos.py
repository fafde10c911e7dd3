"""A broadcast under real worker and beat processes, its fan-out killed on purpose (fault points)
and at random (SIGKILL every few seconds), counted at the receiving server: every eligible
recipient's message arrives under exactly one idempotency key, nobody is requested twice, and
every recipient left out has a recorded reason."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from clarion.standins.receiver import Receiver
from clarion.tasks.broadcasts import broadcast, broadcast_progress
from tests.support.broadcasts import CATALOG, join, recipients, use_broadcast_catalog
from tests.support.cluster import Cluster, counts, wait_settled

pytestmark = pytest.mark.acceptance

FAST = {
    "CLARION_CLAIM_LEASE": "3",
    "CLARION_STRAY_AFTER": "2",
    "CLARION_BATCH_SIZE": "100",
    "CLARION_TICK_INTERVAL": "0.5",
}


def _run(clarion_env, tmp_path: Path, monkeypatch, size: int, chunk: int, timeout: float) -> None:
    use_broadcast_catalog(monkeypatch)
    rng = random.Random(28)
    eligible = recipients("us", size)  # marketing is opt-out in the US
    opted_out = recipients("de", size // 20, country="DE", zone="Europe/Berlin")
    join("campaign", eligible + opted_out)
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        env = {
            **clarion_env.env,
            **FAST,
            "CLARION_CATALOG": str(CATALOG),
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_BROADCAST_CHUNK": str(chunk),
            # the fan-out itself dies three times: twice after a chunk's commit, once before one
            "CLARION_FAULTS": "broadcast.after_chunk=crash*2,broadcast.before_commit=crash*1",
            "CLARION_FAULTS_DIR": str(tmp_path / "faults"),
        }
        cluster = Cluster(env, tmp_path / "logs")
        workers = ["w1", "w2", "w3"]
        kills: list[tuple[str, bool]] = []  # (worker, while the fan-out was running)
        stop = threading.Event()

        def fanning_out() -> bool:
            return counts("SELECT count(*) FROM broadcasts WHERE state = 'running'") > 0

        def chaos() -> None:
            # SIGKILL a worker every few seconds while the fan-out runs, at least 3 and at most
            # 10 in all (a worker takes seconds to start on a busy 2-core host: kill faster and
            # none is ever up)
            pause = rng.uniform(0.3, 0.8)  # the first soon after the broadcast starts
            while not stop.wait(pause):
                pause = rng.uniform(2.0, 4.0)
                running = fanning_out()
                if len(kills) >= 10 or not running and len(kills) >= 3:
                    return
                victim = rng.choice(workers)
                cluster.kill(victim)
                kills.append((victim, running))
                cluster.restart(victim)

        try:
            for name in workers:
                cluster.worker(name)
            cluster.beat()
            cluster.wait_ready(workers, 60)
            killer = threading.Thread(target=chaos, daemon=True)
            killer.start()
            started = broadcast("newsletter", {"topic": "campaign"}, {"issue": "chaos"})
            settled = wait_settled(timeout, expect_sent=size)
            stop.set()
            killer.join()
        finally:
            cluster.stop()
    assert settled, f"the broadcast did not settle: {broadcast_progress(started.id).as_json()}"
    assert len(list((tmp_path / "faults").iterdir())) == 3, "the fan-out was not killed 3 times"
    assert sum(during for _, during in kills) >= 1, f"no worker killed during the fan-out: {kills}"
    occurrence = f"broadcast:{started.id}"
    arrived = receiver.arrivals.occurrences
    assert {o.split("/")[0] for o in arrived} == set(eligible), "a recipient missed, or a stranger"
    assert all(o.endswith(f"/newsletter/{occurrence}") for o in arrived)
    split = [o for o, keys in arrived.items() if len(keys) != 1]
    assert split == [], f"recipients reached under more than one idempotency key: {split[:5]}"
    assert counts("SELECT count(*) FROM requests") == size + len(opted_out)
    assert counts(
        "SELECT count(DISTINCT r.user_id) FROM requests r JOIN decisions d "
        "ON d.user_id = r.user_id AND d.request_id = r.id AND d.reason = 'opted_out'"
    ) == len(opted_out), "a recipient left out without a recorded reason"
    shown = broadcast_progress(started.id).as_json()
    assert (shown["state"], shown["requested"], shown["sent"]) == (
        "done",
        size + len(opted_out),
        size,
    )
    print(
        f"\n{size} recipients: kills={len(kills)} arrivals={receiver.arrivals.total} "
        f"unique={receiver.arrivals.unique} repeats dropped by key={receiver.arrivals.repeats}"
    )


def test_a_broadcast_survives_its_fan_out_and_workers_killed(clarion_env, tmp_path, monkeypatch):
    _run(clarion_env, tmp_path, monkeypatch, size=2_000, chunk=100, timeout=180)


@pytest.mark.soak
def test_a_200k_broadcast_survives_its_fan_out_and_workers_killed(
    clarion_env, tmp_path, monkeypatch
):
    _run(clarion_env, tmp_path, monkeypatch, size=200_000, chunk=1000, timeout=3600)
