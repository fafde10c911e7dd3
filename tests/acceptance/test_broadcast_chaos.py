"""A broadcast under real worker and beat processes, its fan-out killed on purpose (fault points)
and at random (SIGKILL every few seconds), counted at the receiving server: every eligible
recipient's message arrives under exactly one idempotency key, nobody is requested twice, and
every recipient left out has a recorded reason.

The run without a restart (2,000 recipients) is `soak`: the `chaos` run does all it does. The
restart runs (marked `chaos` at 2,000 recipients, `soak` at 200,000) own their PostgreSQL and
Redis (tests/support/services.py) and restart PostgreSQL once mid-fan-out as well: every open
connection is cut, and the fan-out, route and deliver tasks come back from it. There, every repeat
at the receiver (a message that arrived twice under its key: a crash between the provider taking
it and "sent" being recorded) must be matched by a `repeat` incident on that delivery, and every
such incident by a repeat. They then cancel a second broadcast mid-fan-out: the `requested` the
cancel reports is what the receiver got."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clarion.db.engine import engine
from clarion.ops import launch
from clarion.standins.receiver import Receiver
from clarion.tasks.broadcasts import broadcast, broadcast_progress, cancel_broadcast
from tests.support import services
from tests.support.broadcasts import CATALOG, join, recipients, use_broadcast_catalog
from tests.support.cluster import Cluster, counts, wait_settled

pytestmark = pytest.mark.acceptance

FAST = {
    "CLARION_CLAIM_LEASE": "3",
    "CLARION_STRAY_AFTER": "2",
    "CLARION_BATCH_SIZE": "100",
    "CLARION_TICK_INTERVAL": "0.5",
}


def _asked(sql: str, default: int) -> int:
    """A count, or `default` while the database restarts (its connections are cut)."""
    try:
        return counts(sql)
    except Exception:  # the restart cuts connections: ask again next time
        engine().dispose()
        return default


def _requested(broadcast_id: int) -> tuple[str, int, int]:
    """(state, requested, planned) of a broadcast, read straight from its row."""
    with engine().connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT state, requested, planned FROM broadcasts WHERE id = %s", (broadcast_id,)
        ).one()
    return str(row[0]), int(row[1]), int(row[2])


def _mid_fan_out(broadcast_id: int, timeout: float) -> tuple[str, int, int]:
    """Wait until the broadcast's fan-out has requested some of its recipients and not all."""
    seen: list[tuple[str, int, int]] = []

    def started() -> bool:
        try:
            seen.append(_requested(broadcast_id))
        except Exception:
            engine().dispose()
            return False
        return seen[-1][1] > 0 or seen[-1][0] != "running"

    assert launch.wait_until(started, timeout, 0.02), "the fan-out never started"
    return seen[-1]


def _incidents() -> set[int]:
    with engine().connect() as conn:
        found = conn.exec_driver_sql("SELECT delivery_id FROM incidents WHERE kind = 'repeat'")
        return {int(r[0]) for r in found}


def _run(
    env: dict[str, str],
    tmp_path: Path,
    size: int,
    chunk: int,
    timeout: float,
    postgres: Any = None,
) -> None:
    """The broadcast under kills (and, given `postgres`, one restart of it mid-fan-out)."""
    rng = random.Random(28)
    eligible = recipients("us", size)  # marketing is opt-out in the US
    opted_out = recipients("de", size // 20, country="DE", zone="Europe/Berlin")
    join("campaign", eligible + opted_out)
    later: list[str] = []  # the audience of the broadcast cancelled mid-fan-out (restart runs)
    if postgres is not None:
        later = recipients("ca", max(3_000, size // 10), country="CA", zone="America/Toronto")
        join("later", later)
    with Receiver(env["CLARION_WEBHOOK_SECRET"]) as receiver:
        env = {
            **env,
            **FAST,
            "CLARION_CATALOG": str(CATALOG),
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_BROADCAST_CHUNK": str(chunk),
            # the fan-out itself dies three times: twice after a chunk's commit, once before one;
            # and three sends die right after the provider took the message: repeats for sure
            "CLARION_FAULTS": "broadcast.after_chunk=crash*2,broadcast.before_commit=crash*1,"
            "deliver.after_send=crash*3",
            "CLARION_FAULTS_DIR": str(tmp_path / "faults"),
        }
        cluster = Cluster(env, tmp_path / "logs")
        workers = ["w1", "w2", "w3"]
        kills: list[tuple[str, bool]] = []  # (worker, while the fan-out was running)
        stop = threading.Event()

        def fanning_out() -> bool:
            return _asked("SELECT count(*) FROM broadcasts WHERE state = 'running'", 1) > 0

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

        restarted_at: tuple[str, int, int] | None = None
        try:
            for name in workers:
                cluster.worker(name)
            cluster.beat()
            cluster.wait_ready(workers, 60)
            killer = threading.Thread(target=chaos, daemon=True)
            killer.start()
            started = broadcast("newsletter", {"topic": "campaign"}, {"issue": "chaos"})
            if postgres is not None:
                restarted_at = _mid_fan_out(started.id, 120)
                services.restart_postgres(postgres)  # every open connection is cut
                engine().dispose()
            settled = wait_settled(timeout, expect_sent=size)
            stop.set()
            killer.join()
            cancelled = _cancel_mid_fan_out(later, timeout) if postgres is not None else None
        finally:
            stop.set()
            cluster.stop()
    assert settled, f"the broadcast did not settle: {broadcast_progress(started.id).as_json()}"
    fired = sorted(p.name.rsplit(".", 1)[0] for p in (tmp_path / "faults").iterdir())
    assert (
        fired
        == ["broadcast.after_chunk"] * 2 + ["broadcast.before_commit"] + ["deliver.after_send"] * 3
    ), f"the fault points did not all fire: {fired}"
    assert sum(during for _, during in kills) >= 1, f"no worker killed during the fan-out: {kills}"
    occurrence = f"broadcast:{started.id}"
    arrived = {o: k for o, k in receiver.arrivals.occurrences.items() if o.endswith(occurrence)}
    assert {o.split("/")[0] for o in arrived} == set(eligible), "a recipient missed, or a stranger"
    assert all(o.endswith(f"/newsletter/{occurrence}") for o in arrived)
    split = [o for o, keys in arrived.items() if len(keys) != 1]
    assert split == [], f"recipients reached under more than one idempotency key: {split[:5]}"
    assert counts(f"SELECT count(*) FROM requests WHERE occurrence_key = '{occurrence}'") == (
        size + len(opted_out)
    )
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
    summary = (
        f"\n{size} recipients: kills={len(kills)} arrivals={receiver.arrivals.total} "
        f"unique={receiver.arrivals.unique} repeats dropped by key={receiver.arrivals.repeats}"
    )
    summary += _assert_each_repeat_has_its_incident(receiver)
    if postgres is not None:
        assert restarted_at is not None and cancelled is not None
        summary += _assert_the_restart_and_the_cancel(receiver, restarted_at, cancelled, later)
    print(summary)


def _cancel_mid_fan_out(audience: list[str], timeout: float) -> tuple[int, int]:
    """Start a broadcast to `audience`, cancel it once its fan-out is under way, wait for what it
    requested to be sent; (broadcast id, requested as the cancel reported it)."""
    second = broadcast("notice", {"topic": "later"})
    _mid_fan_out(second.id, 60)
    stopped = cancel_broadcast(second.id)
    assert stopped.state == "cancelled", f"too late to cancel: {stopped}"
    assert 0 < stopped.requested < len(audience), stopped
    assert wait_settled(timeout), "the cancelled broadcast's requests did not settle"
    return second.id, stopped.requested


def _assert_the_restart_and_the_cancel(
    receiver: Receiver,
    restarted_at: tuple[str, int, int],
    cancelled: tuple[int, int],
    later: list[str],
) -> str:
    state, requested, planned = restarted_at
    assert state == "running" and 0 < requested < planned, (
        f"the database restart was not mid-fan-out: {restarted_at}"
    )
    a = receiver.arrivals
    second, reported = cancelled
    occurrence = f"/notice/broadcast:{second}"
    got = [o for o in a.occurrences if o.endswith(occurrence)]
    assert len(got) == reported, f"the cancel reported {reported}, the receiver got {len(got)}"
    assert {o.split("/")[0] for o in got} <= set(later)
    return (
        f"; restart at {requested}/{planned} requested; cancelled at {reported}/{len(later)}, "
        f"received {len(got)}"
    )


def _assert_each_repeat_has_its_incident(receiver: Receiver) -> str:
    """Counted at the receiver: a key that arrived more than once is a repeat (a crash between
    the provider taking the message and "sent"); each must have its `repeat` incident, and each
    such incident its repeat. At least the three deliver.after_send crashes made one each."""
    a = receiver.arrivals
    repeated = {d for k, n in a.by_key.items() if n > 1 and (d := a.deliveries[k]) is not None}
    incidents = _incidents()
    assert len(repeated) >= 3, f"fewer repeats than the crashes after a send: {repeated}"
    assert repeated <= incidents, f"repeats without an incident: {sorted(repeated - incidents)}"
    assert incidents <= repeated, f"incidents without a repeat: {sorted(incidents - repeated)}"
    return f"; repeats={len(repeated)} deliveries, repeat incidents={len(incidents)}"


@pytest.fixture
def own_services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[services.Own]:
    with services.own_services(
        tmp_path, monkeypatch, "broadcast_chaos", {"CLARION_CATALOG": str(CATALOG), **FAST}
    ) as own:
        yield own


@pytest.mark.soak  # the chaos run below does all of this and restarts PostgreSQL too
def test_a_broadcast_survives_its_fan_out_and_workers_killed(clarion_env, tmp_path, monkeypatch):
    use_broadcast_catalog(monkeypatch)
    _run(clarion_env.env, tmp_path, size=2_000, chunk=100, timeout=180)


@pytest.mark.chaos
def test_a_broadcast_survives_kills_and_a_database_restart_mid_fan_out(own_services, tmp_path):
    env, postgres, _ = own_services
    _run(env, tmp_path, size=2_000, chunk=25, timeout=240, postgres=postgres)


@pytest.mark.soak
@pytest.mark.timeout(3600)  # ~7 min on a quiet 2-core host; far longer when it is shared
def test_a_200k_broadcast_survives_kills_and_a_database_restart_mid_fan_out(own_services, tmp_path):
    env, postgres, _ = own_services
    _run(env, tmp_path, size=200_000, chunk=1000, timeout=3600, postgres=postgres)
