"""What the documented commands write: an idle worker and beat write nothing at INFO, and with
CLARION_LOG_FORMAT=json every line of every process (worker, beat, web, a CLI command) is JSON."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from clarion.ops import launch
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from tests.support.cluster import counts

pytestmark = pytest.mark.acceptance

BIN = Path(sys.executable).parent
IDLE_TICKS = 20  # ticks the idle run spans (one a second: CLARION_TICK_INTERVAL's default)


@pytest.fixture
def documented_env(clarion_env, monkeypatch) -> dict[str, str]:
    """The documented environment only: the harness's PROMETHEUS_MULTIPROC_DIR is not passed on."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    return dict(clarion_env.env)


def ticks(home: Path) -> float:
    """clarion_tick_seconds_count summed over the processes' files in $CLARION_HOME/metrics."""
    files = [str(p) for p in (home / "metrics").glob("*.db")]
    return sum(
        s.value
        for family in MultiProcessCollector.merge(files)
        for s in family.samples
        if s.name == "clarion_tick_seconds_count"
    )


def lines(folder: Path) -> dict[str, list[str]]:
    return {p.stem: p.read_text(errors="replace").splitlines() for p in folder.glob("*.log")}


def wait_for(predicate, timeout: float, what: str) -> None:
    assert launch.wait_until(predicate, timeout, interval=0.2), what


@pytest.fixture
def started(tmp_path: Path) -> Iterator[dict[str, launch.Process]]:
    processes: dict[str, launch.Process] = {}
    yield processes
    for process in processes.values():
        process.stop()


@pytest.mark.soak  # twenty seconds of idle ticks, by design
def test_an_idle_worker_and_beat_write_no_info_line(documented_env, tmp_path, started):
    home, logs = Path(documented_env["CLARION_HOME"]), tmp_path / "logs"
    logs.mkdir()
    clarion = str(BIN / "clarion")
    for name, command in {
        "worker": [clarion, "worker", "-c", "1"],  # every lane, the control lane's tick included
        "beat": [clarion, "beat"],
    }.items():
        started[name] = launch.Process(command, env=documented_env, log=logs / f"{name}.log")
    wait_for(lambda: ticks(home) >= 2, 60, f"no tick counted: see {logs}")
    before, first = lines(logs), ticks(home)
    started_at = time.monotonic()
    wait_for(lambda: ticks(home) >= first + IDLE_TICKS, 60, f"ticks stopped: see {logs}")
    took = time.monotonic() - started_at
    written = {name: found[len(before[name]) :] for name, found in lines(logs).items()}
    print(f"{ticks(home) - first:.0f} ticks in {took:.1f} s; lines written: {written}")
    assert written == {"worker": [], "beat": []}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_with_log_format_json_every_line_of_every_process_is_json(
    documented_env, tmp_path, started, monkeypatch
):
    logs, port = tmp_path / "logs", _free_port()
    logs.mkdir()
    clarion = str(BIN / "clarion")
    with Receiver(documented_env["CLARION_WEBHOOK_SECRET"]) as hooks:
        env = {**documented_env, "CLARION_LOG_FORMAT": "json", "CLARION_WEBHOOK_URL": hooks.url}
        for key in ("CLARION_LOG_FORMAT", "CLARION_WEBHOOK_URL"):
            monkeypatch.setenv(key, env[key])
        for name, command in {
            "worker": [clarion, "worker", "-c", "1"],
            "plain-celery-worker": [str(BIN / "celery"), "-A", "clarion", "worker", "-c", "1"]
            + ["-Q", "activation", "-n", "plain@%h", "--loglevel", "INFO"],
            "beat": [clarion, "beat"],
            "web": [clarion, "web", "--port", str(port), "--access-log"],
        }.items():
            started[name] = launch.Process(command, env=env, log=logs / f"{name}.log")
        register_recipient("ann", timezone="UTC")
        notify("ann", "receipt", event_id="e1", variables={"order": "A-1"})
        wait_for(lambda: hooks.arrivals.unique == 1, 60, f"nothing sent: see {logs}")
        wait_for(lambda: _answers(port), 30, f"web never answered: see {logs}")
        cli = subprocess.run(  # a command that fails: its error is a JSON line too
            [clarion, "send", "no_such_type", "--user", "ann"],
            env={**env},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert cli.returncode == 2 and cli.stdout == ""
    for process in started.values():
        process.stop()
    written = {**lines(logs), "cli": cli.stderr.splitlines()}
    parsed = {name: [json.loads(line) for line in found] for name, found in written.items()}
    loggers = {name: {r["logger"] for r in records} for name, records in parsed.items()}
    assert {"celery.apps.worker", "clarion.supervisor"} <= loggers["worker"], loggers
    assert "celery.apps.worker" in loggers["plain-celery-worker"], loggers
    assert "celery.beat" in loggers["beat"], loggers
    assert {"uvicorn.error", "uvicorn.access"} <= loggers["web"], loggers
    [error] = parsed["cli"]
    assert error["level"] == "ERROR" and "no_such_type" in error["message"], error
    for records in parsed.values():
        for record in records:
            assert {"time", "level", "logger", "message", "process"} <= set(record), record
    assert counts("SELECT count(*) FROM deliveries WHERE state = 'sent'") == 1


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False
