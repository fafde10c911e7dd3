"""Every fault of the multi-host rig in one run (tests/support/hosts.py): pg_auto_failover's
monitor, primary and synchronous secondary on three hosts, Redis Sentinel on three broker hosts,
supervised workers (`clarion worker`) and two beats on three worker hosts, the webhook receiver and
the Slack stand-in on a receiver host. While 20,000 notifications flow (webhook and Slack, at-most-
once and at-least-once types), one after the other, each with a steady window before and after:
SIGKILLs of the Celery workers on two hosts (their supervisors start them again), one worker host's
clock 30 s fast, one worker host cut off from both database hosts for 30 s while it still reaches
the broker and the providers, a broker failover and a PostgreSQL failover. Counted at the receiver
host; the arrivals per second before, during and after each fault are printed and written to
`throughput.md` under the test's tmp_path.

The producer runs at a steady pace until the last fault is over, however long the faults take on
the machine at hand (each fault must find work to do and work to come back to), then the rest up to
the size asked, and at least TAIL of it, after the last fault. TEST_CLARION_SOAK_SIZE=N runs it with
at least N notifications instead of 20,000 (for a quick look)."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from clarion.db.engine import migrate
from clarion.ops import launch
from clarion.standins.fake_slack import FakeSlack
from clarion.standins.receiver import Receiver
from clarion.tasks import register_recipient, runtime
from tests.support.autofailover import AutoFailover
from tests.support.environment import use_only
from tests.support.hosts import Rig, unavailable
from tests.support.redisha import SENTINEL, SentinelRedis
from tests.support.soak import (
    LIBPQ_TIMEOUTS,
    Producer,
    dump_stacks,
    incidents,
    kill_worker,
    rates,
    receiver_on,
    slack_times,
    slack_verdict,
    soak_env,
    start_fleet,
    verdict,
    wait_settled,
)

# ~10 min at 20,000 on a 2-core host; longer when it is shared
pytestmark = [pytest.mark.acceptance, pytest.mark.soak, pytest.mark.timeout(1800)]

SIZE = int(os.environ.get("TEST_CLARION_SOAK_SIZE", "20000"))
OUTCOMES = Path(__file__).parents[1] / "catalog_outcomes.yaml"  # one type per guarantee
# 8 per cycle: 6 webhooks, 2 Slack messages; each half at least once, half at most once
TYPES = ("receipt_webhook", "nudge_webhook") * 3 + ("receipt_slack", "nudge_slack")
PER_USER = 16
WORKERS = ("w1", "w2", "w3")
BROKERS = ("broker1", "broker2", "broker3")
DATABASES = ("db1", "db2")
HOSTS = ("monitor", *DATABASES, *BROKERS, *WORKERS, "receiver")
KILLED = ("w1", "w3")  # their Celery workers SIGKILLed
CUT_OFF = "w2"  # from the database hosts, for OUTAGE seconds
SKEWED = "w3"  # its clock SKEW seconds fast, for OUTAGE seconds
OUTAGE, SKEW = 30.0, 30.0
STEADY = 15.0  # seconds between faults: the window after one and before the next
PRODUCE = 240.0  # the producer's pace: (1 - TAIL) of SIZE in this long (it runs on if need be)
TAIL = 0.05  # the least share produced after the last fault, so every host has work to come back to
USERS = -(-SIZE // PER_USER)


@dataclass
class Fault:
    name: str
    host: str
    began: float  # perf_counter()
    ended: float  # the fault over: healed, or the service answering again
    note: str = ""


def _items() -> Iterator[dict]:
    """Notifications without end: PER_USER for each of USERS, then PER_USER more each, ..."""
    for first in itertools.count(0, PER_USER):
        for u in range(USERS):
            for n in range(first, first + PER_USER):
                yield dict(user_id=f"u{u}", type_key=TYPES[n % len(TYPES)], event_id=f"{u}-{n}")


def test_every_fault_in_one_run_loses_nothing_and_sends_nothing_twice(tmp_path, monkeypatch):
    reason = unavailable()
    assert reason is None, reason  # the soak tier installs what it needs (make hosts-deps)
    folder = Path(f"/tmp/clarion-all-faults-{os.getpid()}")  # PostgreSQL's data: its own user's
    try:
        with Rig(tmp_path / "rig", HOSTS) as rig:
            _run(rig, AutoFailover(rig, folder, nodes=DATABASES), tmp_path, monkeypatch)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(rig: Rig, db: AutoFailover, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db.start()
    broker = SentinelRedis(rig, tmp_path / "redis", hosts=BROKERS)
    broker.start()
    url = f"{db.url}&{LIBPQ_TIMEOUTS}"
    extra = {**SENTINEL, "CLARION_SLACK_TOKEN": FakeSlack.TOKEN}
    env = soak_env(tmp_path / "home", url, broker.url, OUTCOMES, extra)
    with rig.inside("receiver"):
        slack = FakeSlack(host=rig.address("receiver"))
    with receiver_on(rig) as receiver, slack:
        env |= {"CLARION_WEBHOOK_URL": receiver.url, "CLARION_SLACK_API_URL": slack.api_url}
        use_only(monkeypatch, env)
        migrate(url)
        for u in range(USERS):
            register_recipient(f"u{u}", timezone="UTC", addresses={"slack": f"U{u}"})
        start_fleet(rig, WORKERS, tmp_path / "home", tmp_path / "logs", supervised=True, clock=True)
        items = _items()
        producer = Producer(items, batch=20, pause=PRODUCE * 20 / (SIZE * (1 - TAIL)))
        started = time.perf_counter()
        producer.start()

        def arrived() -> int:
            return receiver.arrivals.unique + len(slack.posts())

        assert launch.wait_until(lambda: arrived() >= 200, 300), "nothing arrived"
        warm = time.perf_counter()
        faults: list[Fault] = []
        for fault in (_kills, _skew, _cut_off, _broker_failover, _database_failover):
            time.sleep(STEADY)
            assert producer.is_alive(), (
                f"the producer stopped before {fault.__name__}: {producer.error}"
            )
            try:
                faults.append(fault(rig, db, broker, receiver))
            except AssertionError:
                _show_logs(tmp_path / "logs", producer)
                raise
        last = faults[-1].ended
        producer.stop()
        producer.join(600)
        assert not producer.is_alive(), "the producer never finished its batch"
        more = max(SIZE - len(producer.acknowledged), int(SIZE * TAIL))
        tail = Producer(itertools.islice(items, more), batch=20, pause=0.1)
        tail.start()
        tail.join(600)
        assert not tail.is_alive(), "the producer never finished"
        acknowledged = producer.acknowledged + tail.acknowledged
        assert producer.error is None and tail.error is None, (producer.error, tail.error)
        settled = wait_settled(
            receiver, _count(acknowledged, "webhook"), 300
        ) and launch.wait_until(lambda: len(slack.posts()) >= _count(acknowledged, "slack"), 60)
        finished = time.perf_counter()
        back = _back(rig, receiver, faults, last)
        if None in back.values():  # what a silent host's pool processes wait on, for the reader
            asked = {h: dump_stacks(rig, h) for h, after in back.items() if after is None}
            time.sleep(2)  # the handler writes the stacks as the signal arrives
            print(f"\nstacks asked of {asked}")
            _show_logs(tmp_path / "logs", producer, lines=300)
        for name in WORKERS:
            rig.kill(name)
    assert settled, f"not every occurrence arrived: {arrived()} of {len(acknowledged)}"
    assert len(acknowledged) >= SIZE
    assert receiver.arrivals.rejected == 0, "a webhook's signature was refused"
    figures = verdict(receiver, [i for i in acknowledged if "webhook" in i["type_key"]])
    figures |= slack_verdict(slack, [i for i in acknowledged if "slack" in i["type_key"]])
    precision = _precision(receiver)
    table = _table(faults, [*receiver.arrivals.first_at.values(), *slack_times(slack)], warm)
    report = (
        f"{table}\n\n{len(acknowledged)} notifications (at least {SIZE} asked), offered at most "
        f"{SIZE * (1 - TAIL) / PRODUCE:.0f}/s; start to settled {finished - started:.0f} s; producer "
        f"errors retried {producer.errors + tail.errors} (already written on retry "
        f"{producer.found_on_retry + tail.found_on_retry}); {figures}; incident precision "
        f"{precision:.2f}; first webhook from each worker host after the last fault (s): "
        f"{back}; load average {os.getloadavg()[0]:.1f}\n"
    )
    (tmp_path / "throughput.md").write_text(report)
    print(f"\n{report}")
    assert precision >= 0.9, f"incident precision {precision:.2f} < 0.9"
    missing = [h for h, after in back.items() if after is None]
    assert missing == [], f"worker hosts that sent nothing after their fault: {missing}"


def _show_logs(folder: Path, producer: Producer, lines: int = 40) -> None:
    """What a failed fault leaves to read: the producer's state and each log's last lines."""
    print(
        f"\nproducer: alive {producer.is_alive()}, acknowledged {len(producer.acknowledged)}, "
        f"errors {producer.errors} (last: {producer.last_error})"
    )
    for log in sorted(folder.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.name}\n" + "\n".join(tail))


def _count(items: list[dict], channel: str) -> int:
    return sum(channel in i["type_key"] for i in items)


# --- the faults, each returning when it is over ---------------------------------------------------


def _first_after(receiver: Receiver, at: float, address: str | None = None) -> Callable[[], bool]:
    """An arrival (from `address`, or anyone) later than perf_counter() reading `at`."""

    def seen() -> bool:
        with receiver.arrivals.lock:
            times = (
                receiver.arrivals.senders.get(address, [])
                if address
                else receiver.arrivals.first_at.values()
            )
            return any(t > at for t in times)

    return seen


def _kills(rig: Rig, db: AutoFailover, broker: SentinelRedis, receiver: Receiver) -> Fault:
    began = time.perf_counter()
    killed = {h: kill_worker(rig, h) for h in KILLED}
    assert all(killed.values()), f"no worker to kill: {killed}"
    # a send in flight at the kill lands within a moment; later ones come from the restarted worker
    back = [
        launch.wait_until(_first_after(receiver, began + 2, rig.address(h)), 120) for h in KILLED
    ]
    assert all(back), f"a killed worker did not come back: {dict(zip(KILLED, back, strict=True))}"
    return Fault("SIGKILL workers", ",".join(KILLED), began, time.perf_counter(), str(killed))


def _skew(rig: Rig, db: AutoFailover, broker: SentinelRedis, receiver: Receiver) -> Fault:
    began = time.perf_counter()
    rig.skew(SKEWED, SKEW)
    time.sleep(OUTAGE)
    rig.skew(SKEWED, 0)
    ended = time.perf_counter()
    sent = sum(began < t < ended for t in receiver.arrivals.senders.get(rig.address(SKEWED), []))
    return Fault(f"clock +{SKEW:g} s", SKEWED, began, ended, f"{sent} webhooks from it meanwhile")


def _cut_off(rig: Rig, db: AutoFailover, broker: SentinelRedis, receiver: Receiver) -> Fault:
    began = time.perf_counter()
    for peer in DATABASES:  # each way: nothing it sends arrives, nothing comes back
        rig.block(CUT_OFF, peer)
        rig.block(peer, CUT_OFF)
    time.sleep(OUTAGE)
    for peer in DATABASES:
        rig.unblock(CUT_OFF, peer)
        rig.unblock(peer, CUT_OFF)
    ended = time.perf_counter()
    sent = sum(began < t < ended for t in receiver.arrivals.senders.get(rig.address(CUT_OFF), []))
    return Fault(
        "cut from the database", CUT_OFF, began, ended, f"{sent} webhooks from it meanwhile"
    )


def _broker_failover(
    rig: Rig, db: AutoFailover, broker: SentinelRedis, receiver: Receiver
) -> Fault:
    old = broker.master()
    assert old is not None
    began = time.perf_counter()
    rig.cut(old)  # the master's host drops off, then dies with its sentinel (two of three remain)
    time.sleep(1)
    rig.kill(old)
    new = broker.wait_master(other_than=old)
    promoted = time.perf_counter()
    runtime.reset()  # the test process's own client asks the sentinels again
    assert launch.wait_until(_first_after(receiver, promoted), 180), "nothing after the failover"
    note = f"{old} -> {new}, promoted after {promoted - began:.1f} s"
    return Fault("broker failover", old, began, time.perf_counter(), note)


def _database_failover(
    rig: Rig, db: AutoFailover, broker: SentinelRedis, receiver: Receiver
) -> Fault:
    old = db.primary()
    began = time.perf_counter()
    rig.cut(old)  # COMMITs in flight get no answer
    time.sleep(2)
    rig.kill(old)  # its synchronous standby has every acknowledged commit
    new = db.wait_primary(other_than=old)
    promoted = time.perf_counter()
    assert launch.wait_until(_first_after(receiver, promoted), 180), "nothing after the failover"
    note = f"{old} -> {new}, writable after {promoted - began:.1f} s"
    return Fault("PostgreSQL failover", old, began, time.perf_counter(), note)


# --- the report -------------------------------------------------------------------------------------


def _precision(receiver: Receiver) -> float:
    """Of the deliveries with an incident, the share that the receiver saw repeated."""
    arrivals = receiver.arrivals
    repeated = {arrivals.deliveries[k] for k, n in arrivals.by_key.items() if n > 1}
    marked = set().union(*incidents().values())
    return len(marked & repeated) / len(marked) if marked else 1.0


def _back(
    rig: Rig, receiver: Receiver, faults: list[Fault], last: float
) -> dict[str, float | None]:
    """Per worker host: seconds from the end of its last fault (or of the last fault of all,
    which every host went through) to its first webhook after it; None if none came."""
    out: dict[str, float | None] = {}
    for host in WORKERS:
        own = [f.ended for f in faults if host in f.host.split(",")]
        since = max([*own, last])
        later = [t for t in receiver.arrivals.senders.get(rig.address(host), []) if t > since]
        out[host] = round(min(later) - since, 1) if later else None
    return out


def _table(faults: list[Fault], times: list[float], warm: float) -> str:
    """Arrivals per second (first arrivals of webhooks plus Slack posts) before, during and
    after each fault; the window after one is the window before the next."""
    end = max(times)
    rows = [
        "| fault | host | before /s | during /s | after /s | during (s) | note |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for i, f in enumerate(faults):
        start = faults[i - 1].ended if i else warm
        stop = faults[i + 1].began if i + 1 < len(faults) else end
        before, during, after = rates(times, [start, f.began, f.ended, stop])
        rows.append(
            f"| {f.name} | {f.host} | {before} | {during} | {after} | "
            f"{f.ended - f.began:.1f} | {f.note} |"
        )
    return "\n".join(rows)
