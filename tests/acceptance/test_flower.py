"""`clarion flower` is not open by default: the real command, started as a subprocess, answers 401
without credentials (given, or made up and printed), and with them lists the lane queues with the
depths the broker holds, and its task list fills though workers send no task events until it asks;
`--unauthenticated` on a non-loopback address is refused."""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import kombu
import pytest

from clarion.ops import launch

pytestmark = pytest.mark.acceptance

CLARION = Path(sys.executable).parent / "clarion"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def flower(env: dict[str, str], log: Path, *args: str) -> Iterator[str]:
    """`clarion flower` on a free port; yields its base URL once it answers."""
    port = _port()
    process = launch.Process([str(CLARION), "flower", "--port", str(port), *args], env=env, log=log)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            httpx.get(f"{base}/healthcheck", timeout=1)
            return True
        except httpx.HTTPError:
            return False

    try:
        assert launch.wait_until(up, 20, 0.2), log.read_text()
        yield base
    finally:
        process.stop()


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _env(clarion_env, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLARION_", "FLOWER_"))}
    return {**env, **clarion_env.env, **extra}


def test_flower_wants_the_configured_login_and_then_shows_lane_depths(clarion_env, tmp_path):
    with kombu.Connection(clarion_env.env["CLARION_BROKER_URL"]) as conn:
        waiting = conn.SimpleQueue("activation")
        for i in range(3):  # no worker runs: these stay queued
            waiting.put({"n": i})
        waiting.close()
    env = _env(clarion_env, CLARION_FLOWER_BASIC_AUTH="ops:s3cret-pass")
    with flower(env, tmp_path / "flower.log") as base:
        url = f"{base}/api/queues/length"
        assert httpx.get(url).status_code == 401
        assert httpx.get(f"{base}/", headers=_basic("ops", "wrong")).status_code == 401
        answer = httpx.get(url, headers=_basic("ops", "s3cret-pass"))
        assert answer.status_code == 200, answer.text
    depths = {q["name"]: q["messages"] for q in answer.json()["active_queues"]}
    if clarion_env.env["CLARION_BROKER_URL"].startswith("amqp"):
        # Flower reads RabbitMQ's queue depths only from the management plugin's HTTP API
        # (`clarion flower --broker-api`); without it the list is empty (docs/operations/monitoring.md, "Flower").
        assert depths == {}
        return
    assert depths == {"transactional": 0, "activation": 3, "control": 0, "events": 0}


def test_without_a_configured_login_one_is_made_up_and_printed(clarion_env, tmp_path):
    log = tmp_path / "flower.log"
    with flower(_env(clarion_env), log) as base:
        found = re.search(r"Flower login for this run: clarion / (\S+)", log.read_text())
        assert found, log.read_text()
        assert httpx.get(f"{base}/api/workers").status_code == 401
        assert httpx.get(f"{base}/", headers=_basic("clarion", found[1])).status_code == 200


def test_unauthenticated_is_refused_off_loopback(clarion_env):
    refused = subprocess.run(
        [str(CLARION), "flower", "--unauthenticated", "--address", "0.0.0.0"],
        env=_env(clarion_env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("clarion: --unauthenticated listens on 0.0.0.0")
    assert len(refused.stderr.splitlines()) == 1


def test_unauthenticated_on_loopback_is_open_as_asked(clarion_env, tmp_path):
    with flower(_env(clarion_env), tmp_path / "open.log", "--unauthenticated") as base:
        assert httpx.get(f"{base}/").status_code == 200


@pytest.mark.parametrize(
    ("address", "configured", "environ", "auth"),
    [
        ("127.0.0.1", "a:b,c:d", {}, "a:b,c:d"),
        ("0.0.0.0", None, {"FLOWER_AUTH": ".*@example.com"}, None),  # Flower's own OAuth
        ("::1", None, {}, "generated"),
    ],
)
def test_the_plan(address, configured, environ, auth):
    from clarion.ops.flower import plan

    chosen = plan(address, unauthenticated=False, configured=configured, environ=environ)
    given = chosen.env.get("FLOWER_BASIC_AUTH")
    if auth == "generated":
        assert given and given.startswith("clarion:") and given[8:] in (chosen.notice or "")
    else:
        assert given == auth


def test_with_clarion_flower_running_its_task_list_fills(clarion_env, tmp_path):
    """Workers send no task events by default (celeryconfig.py); `clarion flower`, as documented,
    asks them for events itself, so the route tasks of notifications show in its task list."""
    from clarion.standins.receiver import Receiver
    from clarion.tasks import notify, register_recipient
    from tests.support.cluster import Cluster

    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as hooks:
        env = {**clarion_env.env, "CLARION_WEBHOOK_URL": hooks.url}
        cluster = Cluster(env, tmp_path / "logs")
        cluster.worker("seen", ["transactional", "control"], concurrency=1)
        try:
            cluster.wait_ready(["seen"], 60)
            register_recipient("ann", timezone="UTC")
            login = _env(clarion_env, **env, CLARION_FLOWER_BASIC_AUTH="ops:s3cret-pass")
            with flower(login, tmp_path / "flower.log") as base:
                sent = [0]

                def listed() -> bool:  # a notification a second until Flower lists one
                    sent[0] += 1
                    notify("ann", "receipt", event_id=f"f{sent[0]}", variables={"order": 1})
                    tasks = httpx.get(f"{base}/api/tasks", headers=_basic("ops", "s3cret-pass"))
                    assert tasks.status_code == 200, tasks.text
                    return any(t.get("name") == "clarion.route" for t in tasks.json().values())

                assert launch.wait_until(listed, 60, 1.0), (tmp_path / "flower.log").read_text()
        finally:
            cluster.stop()
    assert hooks.arrivals.total >= 1
