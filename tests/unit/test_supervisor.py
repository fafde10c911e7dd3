"""The worker supervisor (ops.launch.Supervisor) with real processes, no services: a child that
crashes is started again with backoff and a log line each time, a refusal is final, and SIGTERM or
SIGINT stops child and supervisor cleanly (SIGKILL for a child that ignores SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from clarion.ops.launch import REFUSED, UNAVAILABLE, Backoff, wait_until

# A stand-in worker: records its pid, then exits with the next status in EXITS (or runs until told).
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    starts = sys.argv[1]
    with open(starts, "a") as f:
        f.write(f"{os.getpid()}\\n")
    n = len(open(starts).read().split())
    exits = [int(x) for x in sys.argv[2].split(",") if x]
    if sys.argv[3] == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.argv[3] == "celery-like":  # a pool child in its group; a task that takes 1 s to finish
        def note(what):
            with open(starts + ".signals", "a") as f:
                f.write(what + "\\n")
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, lambda *_: note("pool child got SIGTERM"))
            while True:
                time.sleep(0.1)
        def warm(*_):
            note("main got SIGTERM")
            time.sleep(1.0)
            note("task finished")
            sys.exit(0)
        def cold(*_):
            note("main got SIGQUIT")
            os._exit(1)
        signal.signal(signal.SIGTERM, warm)
        signal.signal(signal.SIGQUIT, cold)
    if n <= len(exits):
        sys.exit(exits[n - 1])
    while True:
        time.sleep(0.1)
""")
SUPERVISOR = textwrap.dedent("""
    import logging, os, sys
    from clarion.ops.launch import Backoff, supervise
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    sys.exit(supervise([sys.executable, sys.argv[1], *sys.argv[2:]],
                       backoff=Backoff(first=0.2, most=0.8, stable=5),
                       stop_timeout=float(os.environ.get("GRACE", "1.5"))))
""")


def _ignore_sigquit() -> None:
    import signal as signals

    signals.signal(signals.SIGQUIT, signals.SIG_IGN)


def _supervise(
    tmp_path: Path, exits: str, mode: str = "", grace: float = 1.5, *, ignoring_quit: bool = False
) -> tuple[subprocess.Popen, Path]:
    child, starts = tmp_path / "child.py", tmp_path / "starts"
    child.write_text(CHILD)
    starts.touch()
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(child), str(starts), exits, mode or "-"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "GRACE": str(grace)},
        # started the way `nohup` or a parent that ignores SIGQUIT would start it: the ignored
        # disposition is inherited across exec unless the supervisor resets it for its child
        preexec_fn=_ignore_sigquit if ignoring_quit else None,
    )
    return proc, starts


def _pids(starts: Path) -> list[int]:
    return [int(p) for p in starts.read_text().split()]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0) until reaped: look at its state
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_crashing_worker_is_restarted_with_backoff_and_stops_cleanly(tmp_path, stop):
    proc, starts = _supervise(tmp_path, "1,3")  # exits 1, then 3, then runs until stopped
    try:
        assert wait_until(lambda: len(_pids(starts)) == 3, timeout=20)
        time.sleep(0.5)
        last = _pids(starts)[-1]
        assert not _gone(last)
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    restarts = [line for line in err.splitlines() if "restarting in" in line]
    assert len(restarts) == 2, err
    assert "exited with 1; restarting in 0.2 s" in restarts[0]
    assert "restarting in 0.4 s" in restarts[1]  # backed off
    assert "stopping the worker" in err and "Traceback" not in err
    assert all(_gone(pid) for pid in _pids(starts))
    assert len(_pids(starts)) == 3  # nothing started after the stop


def test_a_worker_that_refused_to_start_is_not_restarted(tmp_path):
    proc, starts = _supervise(tmp_path, str(REFUSED))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == REFUSED
    assert len(_pids(starts)) == 1
    assert "refused to start; not restarting" in err


def test_a_worker_whose_broker_or_database_is_not_there_yet_is_started_again(tmp_path):
    proc, starts = _supervise(tmp_path, f"{UNAVAILABLE},{UNAVAILABLE}")  # then runs
    try:
        assert wait_until(lambda: len(_pids(starts)) == 3, timeout=20)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert err.count("broker or database is not there yet") == 2, err
    assert f"exited with {UNAVAILABLE}; restarting in 0.2 s" in err
    assert "restarting in 0.4 s" in err and "not restarting" not in err


def _signals(starts: Path) -> list[str]:
    path = Path(f"{starts}.signals")
    return path.read_text().splitlines() if path.exists() else []


def test_sigterm_is_a_warm_stop_of_the_main_process_alone(tmp_path):
    """The pool child never gets SIGTERM (it would die mid-task); the running task finishes."""
    proc, starts = _supervise(tmp_path, "", "celery-like", grace=30)
    try:
        assert wait_until(lambda: len(_pids(starts)) == 1, timeout=20)
        time.sleep(0.5)  # let the child install its handlers
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert _signals(starts) == ["main got SIGTERM", "task finished"], err
    assert proc.returncode == 0, err
    assert "stopping the worker warmly" in err and "cold" not in err


def test_a_second_sigterm_stops_cold_at_once(tmp_path):
    proc, starts = _supervise(tmp_path, "", "celery-like", grace=30)
    try:
        assert wait_until(lambda: len(_pids(starts)) == 1, timeout=20)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: "main got SIGTERM" in _signals(starts), timeout=10)
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert time.monotonic() - began < 5  # not the 30 s grace
    assert "main got SIGQUIT" in _signals(starts), err
    assert "pool child got SIGTERM" not in _signals(starts)
    assert "stopping the worker cold (second signal)" in err
    assert proc.returncode == 1  # not a warm stop
    assert all(_gone(pid) for pid in _pids(starts))


@pytest.mark.parametrize("ignoring_quit", [False, True])
def test_a_child_that_ignores_sigterm_is_killed_after_the_stop_timeout(tmp_path, ignoring_quit):
    proc, starts = _supervise(tmp_path, "", "ignore-term", ignoring_quit=ignoring_quit)
    try:
        assert wait_until(lambda: len(_pids(starts)) == 1, timeout=20)
        time.sleep(0.5)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert 1.0 <= time.monotonic() - began < 6
    assert proc.returncode == 1  # the worker did not stop warmly
    assert _gone(_pids(starts)[0])


@pytest.mark.parametrize(
    ("previous", "ran", "expected"),
    [
        (None, 0.1, 1.0),
        (1.0, 0.1, 2.0),
        (2.0, 5.0, 4.0),
        (16.0, 1.0, 30.0),
        (30.0, 1.0, 30.0),
        (30.0, 60.0, 1.0),
        (8.0, 120.0, 1.0),
    ],
)
def test_backoff_doubles_while_it_keeps_exiting_and_resets_after_a_stable_run(
    previous, ran, expected
):
    assert Backoff(first=1.0, most=30.0, stable=60.0).next(previous, ran) == expected


def test_a_supervisor_killed_outright_takes_its_worker_with_it(tmp_path):
    """SIGKILL the supervisor (an OOM kill, say): its child must not run on unsupervised."""
    import os
    import signal as signals
    import subprocess
    import sys
    import time

    script = (
        "import sys; from clarion.ops import launch; sys.exit(launch.supervise(['sleep', '60']))"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline, child = time.monotonic() + 10, None
        while child is None and time.monotonic() < deadline:
            found = subprocess.run(
                ["pgrep", "-P", str(supervisor.pid)], capture_output=True, text=True
            ).stdout.split()
            child = int(found[0]) if found else None
            time.sleep(0.05)
        assert child is not None, "the supervisor never started its child"
        os.kill(supervisor.pid, signals.SIGKILL)
        supervisor.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _running(child):
            time.sleep(0.05)
        assert not _running(child), "the worker outlived its supervisor"
    finally:
        supervisor.kill()


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its (dead) parent's reaper."""
    from pathlib import Path

    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"
