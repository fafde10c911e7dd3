"""The multi-host rig itself (tests/support/hosts.py): hosts reach each other, and each fault does
what it says. Quick (a few seconds); skipped, with the reason, where the rig cannot run."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from tests.support.hosts import NoNetem, Rig, unavailable

REASON = unavailable()
pytestmark = [pytest.mark.acceptance, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def _ping(rig: Rig, source: str, target: str, count: int = 1, wait: float = 1) -> bool:
    done = rig.run(
        source, ["ping", "-n", "-q", "-c", str(count), "-W", str(wait), rig.address(target)]
    )
    return done.returncode == 0


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture
def rig(tmp_path):
    with Rig(tmp_path / "rig", ("a", "b", "c")) as rig:
        yield rig
    assert rig.hosts["a"].netns not in _namespaces(), "the rig left its namespace behind"


def test_hosts_reach_each_other_and_the_test_process(rig):
    assert rig.address("a") != rig.address("b")
    assert _ping(rig, "a", "b")
    assert _ping(rig, "c", "a")
    root = subprocess.run(["ping", "-n", "-q", "-c", "1", "-W", "1", rig.address("b")])
    assert root.returncode == 0, "the test process cannot reach a host over the bridge"


def test_a_cut_host_is_unreachable_until_healed(rig):
    rig.cut("b")
    assert not _ping(rig, "a", "b")
    assert _ping(rig, "a", "c"), "cutting b cut someone else"
    rig.heal("b")
    assert _ping(rig, "a", "b", count=3, wait=2)


def test_a_block_silences_one_peer_only(rig):
    rig.block("a", "b")  # a hears nothing from b
    assert not _ping(rig, "a", "b")
    assert _ping(rig, "a", "c")
    assert _ping(rig, "c", "b")
    rig.unblock("a", "b")
    assert _ping(rig, "a", "b")


def test_a_degraded_link_adds_its_delay(rig):
    def rtt() -> float:
        started = time.monotonic()
        assert _ping(rig, "a", "b", wait=3)
        return time.monotonic() - started

    before = rtt()
    try:
        rig.degrade("b", delay_ms=150)
    except NoNetem as exc:
        pytest.skip(str(exc))
    slowed = rtt()  # both directions of b's link: at least 2 × 150 ms more
    rig.restore("b")
    assert slowed - before >= 0.3, (before, slowed)
    assert rtt() < slowed - 0.2


def test_a_skewed_host_clock_is_seen_by_date(rig):
    def host_time(clock: bool) -> float:
        out = rig.folder / "date.out"
        rig.start("a", ["date", "+%s"], clock=clock, log=out).popen.wait(10)
        return float(out.read_text().split()[-1])

    assert abs(host_time(True) - time.time()) < 3
    rig.skew("a", 3600)
    time.sleep(1.1)  # libfaketime reads the offset file at most once a second
    assert abs(host_time(True) - time.time() - 3600) < 3, "the skew did not reach the process"
    assert abs(host_time(False) - datetime.now(UTC).timestamp()) < 3, "a process without clock=True"


def test_a_python_process_on_a_skewed_clock_sleeps_and_sees_the_skew(rig):
    out = rig.folder / "python.out"
    rig.skew("a", 30)
    script = "import time; time.sleep(0.05); print(time.time())"  # clock_nanosleep, as workers do
    done = rig.start("a", [sys.executable, "-c", script], clock=True, log=out).popen.wait(10)
    assert done == 0, out.read_text()
    assert abs(float(out.read_text().split()[-1]) - time.time() - 30) < 3


TIMED_WAITS = """
import queue, sys, threading, time
start, stop, bad = time.monotonic(), time.monotonic() + float(sys.argv[1]), []
def waits():
    cond, inbox = threading.Condition(), queue.Queue()
    while time.monotonic() < stop:
        began = time.monotonic()
        with cond:
            cond.wait(0.001)
        try:
            inbox.get(timeout=0.001)
        except queue.Empty:
            pass
        time.sleep(0.001)
        if time.monotonic() - began > 2:
            bad.append(time.monotonic() - began)
threads = [threading.Thread(target=waits, daemon=True) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join(stop + 10 - time.monotonic())
stuck = sum(t.is_alive() for t in threads)
print(stuck, len(bad), round(time.monotonic() - start, 1), time.time())
"""


def test_timed_waits_on_a_skewed_clock_end_while_the_skew_moves(rig):
    """Eight threads of timed waits (a condition, a queue, a sleep: what a worker's sender,
    flusher and batch threads do) in a process on a skewed clock, while the skew steps forward
    and back: none hangs (with libfaketime's faked monotonic clock some did, for decades), the
    monotonic clock does not step, and the wall clock shows the skew."""
    out = rig.folder / "waits.out"
    process = rig.start("a", [sys.executable, "-c", TIMED_WAITS, "6"], clock=True, log=out)
    for seconds in (30, 0, -30, 30):
        time.sleep(1.2)  # libfaketime reads the offset file at most once a second
        rig.skew("a", seconds)
    assert process.popen.wait(30) == 0, out.read_text()
    stuck, slow, took, wall = out.read_text().split()[-4:]
    assert (int(stuck), int(slow)) == (0, 0), out.read_text()
    assert float(took) < 10, "the monotonic clock stepped with the skew"
    assert abs(float(wall) - time.time() - 30) < 3, "the skew did not reach the process"


def test_killing_a_host_stops_its_processes_only(rig):
    sleeper_a = rig.start("a", ["sleep", "600"])
    sleeper_b = rig.start("b", ["sleep", "600"])
    assert rig.kill("a") >= 1
    assert not sleeper_a.alive()
    assert sleeper_b.alive()


def test_a_socket_opened_inside_a_host_serves_there(rig):
    server = rig.listen("c")
    port = server.getsockname()[1]
    with server:
        client = rig.run("a", ["bash", "-c", f"exec 3<>/dev/tcp/{rig.address('c')}/{port}"])
        assert client.returncode == 0, client.stderr
        conn, peer = server.accept()
        conn.close()
        assert peer[0] == rig.address("a")
    with pytest.raises(OSError, match="refused|unreachable"):
        socket.create_connection(("127.0.0.1", port), timeout=1)  # not in the root namespace


def test_a_private_folder_is_the_hosts_own_and_the_machines_stays_untouched(rig, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "machine.txt").write_text("the machine's")
    out = rig.folder / "ls.out"
    seen = rig.start(
        "a",
        ["sh", "-c", f"touch {shared}/host.txt && ls -A {shared}"],
        log=out,
        private=[str(shared)],
    )
    assert seen.popen.wait(10) == 0
    assert out.read_text().split() == ["host.txt"], "the host saw the machine's folder"
    assert sorted(p.name for p in shared.iterdir()) == ["machine.txt"], "the host wrote through"
