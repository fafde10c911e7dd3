"""A worker starts with clarion's config, a reachable broker and a good catalog, or not at all — on
the plain `celery -A tasks.app worker` path and under `clarion worker` — and `clarion worker`
brings a worker whose celery process died back by itself (issue 8 items 5 and 9, issue 9 item 5);
an unmigrated database is refused at start (issue 12 item 7).

Each refusal is a real subprocess that must exit 2 within seconds with one clear line on stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from clarion.ops import launch
from clarion.ops.launch import UNAVAILABLE
from tests.support.cluster import children

pytestmark = pytest.mark.acceptance

CLARION = Path(sys.executable).parent / "clarion"
FOREIGN_CONFIG = textwrap.dedent("""
    # a host app's own Celery settings: no lanes, no late acks
    broker_url = "memory://"
    task_default_queue = "host"
""")
HOST_APP = textwrap.dedent("""
    # a host module that wires clarion's app to its own settings by module name
    from clarion.tasks.app import app
    app.config_from_object("celeryconfig")
""")
BAD_CATALOG = textwrap.dedent("""
    types:
      hello:
        category: transactional
        channels: [console]
        templates:
          - version: 1
            title: "Hi {{ name "
            body: "x"
""")
NOWHERE = {
    "CLARION_DATABASE_URL": "postgresql://clarion@127.0.0.1:1/clarion",
    "CLARION_REDIS_URL": "redis://127.0.0.1:1/0",
    "CLARION_BROKER_URL": "redis://127.0.0.1:1/0",
    "CLARION_WEBHOOK_SECRET": "a-secret-of-our-own",
}


def _env(tmp_path: Path, **values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLARION_", "CELERY_"))}
    return {**env, "CLARION_HOME": str(tmp_path / "home"), **values}


def _celery_worker(*app: str) -> list[str]:
    """The plain path, as an operator types it: no -Q, so the worker consumes the config's queues."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        *(app or ("clarion.tasks.app",)),
        "worker",
        "-P",
        "solo",
        "--loglevel",
        "INFO",
        "--without-mingle",
        "--without-gossip",
    ]


def _refused(command: list[str], env: dict[str, str], cwd: Path, within: float = 20) -> str:
    began = time.monotonic()
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - began < within
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    [line] = [x for x in result.stderr.splitlines() if x.startswith("clarion: ")]
    assert "worker refused to start" in line and "Traceback" not in result.stderr, result.stderr
    return line


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    """A host app's folder holding its own celeryconfig.py (and a module that uses it)."""
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "celeryconfig.py").write_text(FOREIGN_CONFIG)
    (folder / "hostapp.py").write_text(HOST_APP)
    return folder


def test_an_unreachable_broker_and_database_are_waited_for_then_exit_75_not_refused(tmp_path):
    """Not there yet is not wrong: the worker retries with backoff for CLARION_START_WAIT, one
    line per attempt, then exits UNAVAILABLE (its supervisor starts it again)."""
    env = _env(tmp_path, **NOWHERE, CLARION_START_WAIT="8")
    began = time.monotonic()
    result = subprocess.run(
        _celery_worker(), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert 4 <= time.monotonic() - began < 40
    assert result.returncode == UNAVAILABLE, f"{result.stdout}\n{result.stderr}"
    waits = [x for x in result.stderr.splitlines() if "worker not ready (attempt" in x]
    assert 2 <= len(waits) <= 5, result.stderr  # pauses 0.5, 1, 2, 4 s plus the probes' time
    assert (
        "broker: ConfigurationError: the broker redis://127.0.0.1:1/0 cannot be reached"
        in (waits[0])
    )
    assert "database: OperationalError" in waits[0]
    assert "refused" not in result.stderr.replace("Connection refused", "").replace(
        "connection refused", ""
    )
    assert "Traceback" not in result.stderr


def test_a_bad_setting_is_refused_in_one_line_not_a_traceback(tmp_path):
    line = _refused(
        _celery_worker(),
        _env(tmp_path, **{**NOWHERE, "CLARION_WEBHOOK_SECRET": "clarion-dev-secret"}),
        tmp_path,
        within=15,
    )
    assert "CLARION_WEBHOOK_SECRET" in line


def test_no_broker_at_all_is_refused_not_amqp_on_localhost(tmp_path):
    line = _refused(_celery_worker(), _env(tmp_path), tmp_path, within=15)
    assert "CLARION_DATABASE_URL and CLARION_REDIS_URL not set" in line
    assert "amqp" not in line


def test_clarions_app_configured_from_a_foreign_celeryconfig_is_refused(tmp_path, foreign):
    env = _env(tmp_path, PYTHONPATH=str(foreign), **NOWHERE)
    line = _refused(_celery_worker("hostapp"), env, foreign, within=15)
    assert "not clarion's celeryconfig.py" in line


def test_a_foreign_celeryconfig_first_on_sys_path_does_not_replace_clarions(
    clarion_env, tmp_path, foreign
):
    env = _env(tmp_path, PYTHONPATH=str(foreign), **clarion_env.env)
    log = tmp_path / "worker.log"
    worker = launch.Process(_celery_worker(), env=env, log=log, cwd=foreign)
    try:
        assert launch.wait_until(lambda: "ready." in log.read_text(), timeout=60), log.read_text()
    finally:
        worker.stop()
    banner = log.read_text()
    for lane in launch.QUEUES:  # the worker consumes clarion's lanes, not the host's queue
        assert f".> {lane}" in banner, banner
    assert ".> host" not in banner and "memory://" not in banner


def test_a_catalog_that_cannot_load_is_refused_by_celery_and_by_clarion_worker(
    clarion_env, tmp_path
):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_CATALOG)
    env = _env(tmp_path, **{**clarion_env.env, "CLARION_CATALOG": str(bad)})
    line = _refused(_celery_worker(), env, tmp_path)
    assert "bad.yaml: type 'hello' v1 channel 'console' field 'title'" in line
    # under the supervisor: refused once, not restarted in a loop
    result = subprocess.run(
        [str(CLARION), "worker", "--lane", "control", "--pool", "solo"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("worker refused to start: ") == 1, result.stderr
    assert "not restarting" in result.stderr and "restarting in" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [_celery_worker(), [str(CLARION), "worker", "--lane", "control", "--pool", "solo"]],
    ids=["celery worker", "clarion worker"],
)
def test_an_unmigrated_database_is_refused_at_start_not_at_every_tick(
    clarion_env, unmigrated_database, tmp_path, command
):
    env = _env(tmp_path, **{**clarion_env.env, "CLARION_DATABASE_URL": unmigrated_database})
    line = _refused(command, env, tmp_path)
    assert "is not migrated" in line and line.endswith("run `clarion migrate`"), line


def test_clarion_worker_brings_a_dead_worker_back_and_stops_on_sigterm(clarion_env, tmp_path):
    log = tmp_path / "clarion-worker.log"
    env = _env(tmp_path, **clarion_env.env)
    with open(log, "wb") as out:
        supervisor = subprocess.Popen(
            [str(CLARION), "worker", "--lane", "control", "-c", "1", "--restart-delay", "0.5"],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        assert launch.wait_until(lambda: log.read_text().count("ready.") == 1, timeout=60), (
            log.read_text()
        )
        first = children(supervisor.pid)
        os.kill(
            first[0], signal.SIGKILL
        )  # the celery main process dies (as on kombu's AttributeError)
        assert launch.wait_until(lambda: log.read_text().count("ready.") == 2, timeout=60), (
            log.read_text()
        )
        assert "restarting in 0.5 s" in log.read_text()
        assert children(supervisor.pid) != first
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, log.read_text()
    finally:
        supervisor.kill()
    assert children(supervisor.pid) == []
