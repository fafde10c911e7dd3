"""A key's rate holds across `clarion web` processes while each reserves its budget in chunks
(web/api_auth.Reserve): two real server processes on the same PostgreSQL and Redis, 8 clients
sending to both at once. Within one window every accepted request was charged in Redis first, so
the two processes together accept exactly the key's rate (the chunks left are spent by the
requests that follow); and the reservation saves the Redis round trips it is for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from clarion.tasks import register_recipient, runtime
from clarion.web.api_auth import chunk_size, create_key
from tests.support.environment import ROOT

pytestmark = pytest.mark.acceptance

CLI = [sys.executable, "-m", "clarion.ops.cli"]
RATE = 300  # per hour: chunks of 6, one window for the whole test
SENT = 400
CLIENTS = 8


def _serve(clarion: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    process = subprocess.Popen(
        [*CLI, "web", "--host", "127.0.0.1", "--port", "0"],
        cwd=ROOT,
        env={**env, **clarion, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 120
    for line in process.stderr or ():
        if m := re.search(r"Uvicorn running on (http://\S+)", line):
            threading.Thread(target=lambda: [*(process.stderr or ())], daemon=True).start()
            return process, m[1]
        assert time.monotonic() < deadline, line
    raise AssertionError(f"clarion web exited with {process.wait()}")


@pytest.fixture
def servers(own_redis: dict[str, str]) -> Iterator[list[str]]:
    started: list[subprocess.Popen[str]] = []
    try:
        urls = []
        for _ in range(2):
            process, url = _serve(own_redis)
            started.append(process)
            urls.append(url)
        yield urls
    finally:
        for process in started:
            process.terminate()
            process.wait(timeout=60)


def _evals() -> int:
    stats = runtime.redis().info("commandstats")
    return int(stats.get("cmdstat_eval", {}).get("calls", 0))


def test_two_processes_accept_exactly_the_keys_rate_with_fewer_redis_round_trips(servers):
    register_recipient("ann", timezone="UTC")
    made = create_key("shared", ["events:write"], (RATE, 3600))
    assert chunk_size(made.record) > 1
    auth = {"Authorization": f"Bearer {made.secret}"}
    statuses: list[int] = []
    per_server = {url: 0 for url in servers}
    lock = threading.Lock()
    pending = list(range(SENT))
    before = _evals()

    def client(url: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while True:
                with lock:
                    if not pending:
                        return
                    i = pending.pop()
                body = {"event_id": f"e{i}", "user_id": "ann", "type": "receipt"}
                got = http.post(
                    "/v1/events", json={**body, "variables": {"order": str(i)}}, headers=auth
                )
                with lock:
                    statuses.append(got.status_code)
                    per_server[url] += got.status_code == 202

    threads = [threading.Thread(target=client, args=(servers[i % 2],)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    evals = _evals() - before
    assert len(statuses) == SENT
    assert statuses.count(202) == RATE, per_server
    assert statuses.count(429) == SENT - RATE
    assert all(per_server.values()), per_server  # both processes took a share
    # a Redis round trip per chunk, not per accepted request (a refused request makes two: the
    # chunk that does not fit, then its one unit); one per request would be SENT
    chunk = chunk_size(made.record)
    assert evals <= RATE // chunk + 2 * (SENT - RATE) + 2 * 2 * chunk < SENT, evals
