"""`clarion ping`, a worker's readiness probe, against a real `clarion worker` on the test's broker:
exit 0 for the lane it consumes, 1 naming the lanes nobody serves, 1 with the broker's reason
when the broker is down; and before the worker is up, 1."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from clarion.ops import launch
from clarion.ops.ping import served, verdict
from tests.support.environment import ROOT

pytestmark = pytest.mark.acceptance

CLI = [sys.executable, "-m", "clarion.ops.cli"]


def ping(clarion_env, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    return subprocess.run(
        [*CLI, "ping", *args],
        env={**base, **clarion_env.env, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_ping_answers_for_the_lanes_a_worker_consumes(clarion_env, tmp_path):
    before = ping(clarion_env, "--lane", "transactional", "--timeout", "1")
    assert before.returncode == 1
    assert "no worker answered for lane(s) transactional (answered: none)" in before.stderr
    worker = launch.Process(
        [*CLI, "worker", "--lane", "transactional", "--name", "pinged", "--no-restart"],
        env={**clarion_env.env, "PYTHONPATH": str(ROOT)},
        log=tmp_path / "worker.log",
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 90
        while (done := ping(clarion_env, "--lane", "transactional")).returncode != 0:
            assert worker.alive(), (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, done.stderr
        assert done.stdout.startswith("ok: transactional (pinged@")
        every = ping(clarion_env)  # default: every lane
        assert every.returncode == 1
        assert every.stderr.startswith(
            "clarion: no worker answered for lane(s) activation, control"
        )
        assert "pinged@" in every.stderr and len(every.stderr.strip().splitlines()) == 1
    finally:
        worker.stop()


def test_ping_with_the_broker_down_is_one_line_and_fast(clarion_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    done = ping(clarion_env, "--timeout=1", CLARION_BROKER_URL=f"redis://127.0.0.1:{port}/0")
    assert done.returncode == 1
    assert done.stderr.startswith("clarion: the broker redis://127.0.0.1:")
    assert "cannot be reached" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < 30


def test_the_verdict_names_missing_lanes_and_who_answered():
    replies = {
        "a@h": [{"name": "transactional"}, {"name": "control"}],
        "b@h": [{"name": "transactional"}],
    }
    by_queue = served(replies)
    assert by_queue == {"transactional": ["a@h", "b@h"], "control": ["a@h"]}
    assert verdict(["transactional"], by_queue) == (True, "ok: transactional (a@h, b@h)")
    assert verdict(["transactional", "activation"], by_queue) == (
        False,
        "no worker answered for lane(s) activation (answered: a@h, b@h)",
    )
    assert verdict(["control"], served(None))[0] is False
