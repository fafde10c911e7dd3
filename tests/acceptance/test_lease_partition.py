"""A worker host cut off from the database, not from the provider, while it holds a claim whose
send went out (tests/support/hosts.py): its lease runs out on PostgreSQL's clock, another host
takes the delivery over and sends it again under the same idempotency key; after the heal the
cut-off host's `mark_sent`, held in its TCP connection all along, arrives late. Counted at the
receiver: one occurrence, one key, the repeat dropped by the receiver, and the incidents name
that delivery and no other."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from clarion.db.engine import migrate
from clarion.ops import launch
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from tests.support.environment import CATALOG, WEBHOOK_SECRET, use_only
from tests.support.hostdb import start_postgres
from tests.support.hosts import Rig, unavailable
from tests.support.soak import incidents

pytestmark = [pytest.mark.acceptance, pytest.mark.soak]

HOSTS = ("db", "broker", "w1", "w2", "receiver")
HOLD = 8  # seconds w1 waits after the provider's answer (a fault point): the test cuts it then
FAST = {
    "CLARION_CLAIM_LEASE": "6",
    "CLARION_SEND_TIMEOUT": "3",
    "CLARION_STRAY_AFTER": "2",
    "CLARION_TICK_INTERVAL": "0.5",
    "CLARION_START_WAIT": "60",
}


def test_a_late_mark_sent_after_a_lease_expired_in_a_partition_ends_with_one_send(
    tmp_path, monkeypatch
):
    reason = unavailable()
    assert reason is None, reason
    folder = Path(f"/tmp/clarion-lease-{os.getpid()}")
    try:
        with Rig(tmp_path / "rig", HOSTS) as rig:
            _run(rig, folder, tmp_path, monkeypatch)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(rig: Rig, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = start_postgres(rig, "db", folder / "db")
    broker = f"redis://{rig.address('broker')}:6379/0"
    rig.start(
        "broker",
        ["/usr/bin/redis-server", "--bind", rig.address("broker"), "--port", "6379"]
        + ["--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", str(tmp_path)],
        log=tmp_path / "redis.log",
    )
    env = {
        "CLARION_HOME": str(tmp_path / "home"),
        "CLARION_DATABASE_URL": url,
        "CLARION_REDIS_URL": broker,
        "CLARION_CATALOG": str(CATALOG),
        "CLARION_WEBHOOK_SECRET": WEBHOOK_SECRET,
        **FAST,
    }
    with rig.inside("receiver"):
        receiver = Receiver(WEBHOOK_SECRET, host=rig.address("receiver"))
    with receiver:
        env["CLARION_WEBHOOK_URL"] = receiver.url
        use_only(monkeypatch, env)
        migrate(url)
        register_recipient("u0", timezone="Europe/Berlin")
        logs = tmp_path / "logs"
        logs.mkdir()
        worker = launch.worker_command(launch.QUEUES, concurrency=1, name="w1", loglevel="INFO")
        rig.start(
            "w1",
            worker,
            env={"CLARION_FAULTS": f"deliver.after_send=sleep:{HOLD}*1"},
            log=logs / "w1.log",
        )
        notify("u0", "receipt", event_id="order-1", variables={"order": "1"})
        assert launch.wait_until(lambda: receiver.arrivals.unique == 1, 60), "w1 sent nothing"
        # w1 holds its claim and the provider's answer; now it hears nothing from the database
        # and reaches nothing there (the receiver and the broker stay reachable)
        rig.block("w1", "db")
        rig.block("db", "w1")
        cut_at = time.monotonic()
        [key] = list(receiver.arrivals.by_key)
        delivery = receiver.arrivals.deliveries[key]
        rig.start(
            "w2",
            launch.worker_command(launch.QUEUES, concurrency=1, name="w2", loglevel="INFO"),
            log=logs / "w2.log",
        )
        home = tmp_path / "home" / "beat"
        home.mkdir(parents=True)
        rig.start("w2", launch.beat_command(home), log=logs / "beat.log")
        # the lease runs out; w2's tick hands the row on, w2 sends again under the key
        taken = launch.wait_until(lambda: receiver.arrivals.by_key[key] >= 2, 90)
        taken_at = time.monotonic()
        rig.unblock("w1", "db")
        rig.unblock("db", "w1")
        healed_at = time.monotonic()
        late = launch.wait_until(lambda: "possible_duplicate" in incidents(), 120)
        late_at = time.monotonic()
        state = _state(delivery)
        details = _details(delivery)
    assert taken, "no takeover: the receiver got the key once"
    arrivals = receiver.arrivals
    assert list(arrivals.occurrences.values()) == [{key}], "one occurrence, under one key"
    assert arrivals.by_key[key] == 2, "sent by w1, sent again by w2's takeover; never a third"
    assert state == "sent"
    found = incidents()
    assert found.get("repeat") == {delivery}, found  # w2's send: the receiver had the key
    assert late, f"w1's late mark_sent left no trace: {found}"
    assert found.get("possible_duplicate") == {delivery}, found
    assert set(found) == {"repeat", "possible_duplicate"}, found
    # the late one says what happened: w1's record came after the takeover
    assert any("taken over before it was recorded" in d for d in details), details
    print(
        f"\nlease partition: takeover sent {taken_at - cut_at:.1f} s after the cut; "
        f"w1's late mark_sent recorded {late_at - healed_at:.1f} s after the heal; "
        f"receiver: {arrivals.total} arrivals under 1 key ({arrivals.repeats} dropped); "
        f"incidents {sorted(found)}"
    )


def _details(delivery: int | None) -> list[str]:
    from sqlalchemy import text

    from clarion.db.engine import engine

    with engine().connect() as conn:
        rows = conn.execute(
            text("SELECT detail FROM incidents WHERE delivery_id = :d"), {"d": delivery}
        )
        return [str(r[0]) for r in rows]


def _state(delivery: int | None) -> str:
    from sqlalchemy import text

    from clarion.db.engine import engine

    with engine().connect() as conn:
        found = conn.execute(text("SELECT state FROM deliveries WHERE id = :d"), {"d": delivery})
        return str(found.scalar_one())
