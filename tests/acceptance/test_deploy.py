"""A deploy under load (issue 23 item 7): `clarion worker` SIGTERMed while 500 webhook sends are in
flight against a slow receiver. Its running tasks finish (a warm stop of the Celery main process
alone: no WorkerLostError, no pool child killed mid-send), the next worker takes the rest, and
at the receiver every notification arrives exactly once; no incident, no claim taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clarion.ops import launch
from clarion.standins.receiver import Receiver
from clarion.tasks import notify_many, register_recipient
from tests.support.cluster import counts, wait_settled
from tests.support.environment import WEBHOOK_SECRET, reset_process_state

pytestmark = pytest.mark.acceptance

CLARION = Path(sys.executable).parent / "clarion"
CATALOG = Path(__file__).parents[1] / "catalog_outcomes.yaml"
SENDS = 500


def _clarion_worker(env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(CLARION), "worker", "-c", "2", "--loglevel", "INFO"],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_sigterm_under_load_lets_running_sends_finish_and_sends_each_once(
    clarion_env, tmp_path, monkeypatch
):
    monkeypatch.setenv("CLARION_CATALOG", str(CATALOG))
    reset_process_state()  # this process's catalog too
    with Receiver(WEBHOOK_SECRET, latency=0.25) as receiver:  # slow: sends are really in flight
        env = {
            **os.environ,
            **clarion_env.env,
            "CLARION_CATALOG": str(CATALOG),
            "CLARION_WEBHOOK_URL": receiver.url,
            "CLARION_SHUTDOWN_GRACE": "60",
            "CLARION_STRAY_AFTER": "5",
        }
        register_recipient("u1", timezone="UTC")
        first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
        first = _clarion_worker(env, first_log, tmp_path)
        second = beat = None
        try:
            items = [
                dict(user_id="u1", type_key="receipt_webhook", event_id=f"e{n}")
                for n in range(SENDS)
            ]
            notify_many(items)
            assert launch.wait_until(lambda: receiver.arrivals.total >= 40, 120, 0.1), (
                first_log.read_text()
            )
            first.send_signal(signal.SIGTERM)  # what a deploy does
            assert first.wait(90) == 0, first_log.read_text()
            at_stop = receiver.arrivals.total
            assert at_stop < SENDS, "everything was sent before the stop: nothing was in flight"
            second = _clarion_worker(env, second_log, tmp_path)
            beat = launch.Process(launch.beat_command(tmp_path), env=env, log=tmp_path / "beat.log")
            settled = wait_settled(180, expect_sent=SENDS)
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(90)
            if beat is not None:
                beat.stop()
    log = first_log.read_text()
    print(f"\narrivals at the SIGTERM's end: {at_stop} of {SENDS}")
    assert settled, second_log.read_text()[-3000:]
    assert "stopping the worker warmly" in log
    assert "WorkerLostError" not in log and "exited with 'signal" not in log, log[-3000:]
    assert "cold" not in log
    arrivals = receiver.arrivals
    assert arrivals.total == SENDS and arrivals.repeats == 0  # each once, counted at the receiver
    assert len(arrivals.occurrences) == SENDS
    assert counts("SELECT count(*) FROM incidents") == 0  # no possible_duplicate, no takeover
    assert counts("SELECT count(*) FROM deliveries WHERE state = 'sent'") == SENDS
