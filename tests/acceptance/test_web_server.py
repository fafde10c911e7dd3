"""`clarion web` as operators run it: a real process with two worker processes, a 2 s header
timeout and an admin listener, on the test's PostgreSQL and Redis.

- 150 clients that send their request headers a line every 0.5 s are each closed by the server
  (408) within the header timeout plus a small slack, while /healthz keeps answering (its latency
  measured and printed); a kept-alive connection whose second request crawls is closed too.
- /metrics, /docs and /openapi.json answer 404 on the public listener and 200 on the admin one;
  the API is not on the admin one.

Each spawned worker starts 6 s late (a sitecustomize sleeps before the worker can answer its
supervisor), as on a busy host: past uvicorn's default 5 s ping, which killed and re-spawned such
workers for ever; `clarion web` waits longer.
"""

from __future__ import annotations

import asyncio
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openapi_spec_validator import validate

from tests.support.environment import ROOT

pytestmark = pytest.mark.acceptance

CLI = [sys.executable, "-m", "clarion.ops.cli"]
HEADER_TIMEOUT = 2.0
SLACK = 1.0  # the server's timer fires on its event loop: allowed lateness under a busy machine
SLOW_CLIENTS = 150


@dataclass
class Web:
    public: str
    admin: str
    log: list[str]


SLOW_START = 6.0  # seconds each spawned worker sleeps before it can answer a ping
SITECUSTOMIZE = f"""
import sys, time
if "--multiprocessing-fork" in sys.argv:  # a worker that multiprocessing spawned
    time.sleep({SLOW_START})
"""


def _env(clarion_env, slow_start: Path) -> dict[str, str]:
    import os

    slow_start.mkdir()
    (slow_start / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    return {**env, **clarion_env.env, "PYTHONPATH": f"{slow_start}:{ROOT}"}


@pytest.fixture
def web(clarion_env, tmp_path: Path) -> Iterator[Web]:
    command = [
        *CLI,
        "web",
        "--port",
        "0",
        "--workers",
        "2",
        "--header-timeout",
        str(HEADER_TIMEOUT),
        "--admin-bind",
        "127.0.0.1:0",
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=_env(clarion_env, tmp_path / "slow-start"),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    log: list[str] = []
    found: dict[str, str] = {}

    def read() -> None:  # drain stderr all along: a full pipe would stall the server
        for line in process.stderr or ():
            log.append(line)
            if m := re.search(r"admin listener .* on (http://\S+)", line):
                found["admin"] = m[1]
            if m := re.search(r"Uvicorn running on (http://\S+)", line):
                found.setdefault("public", m[1])

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 120  # two spawned workers import clarion on a busy machine
        while not _answers(found.get("public")):
            assert process.poll() is None, "".join(log)
            assert time.monotonic() < deadline, "".join(log)
            time.sleep(0.2)
        assert "admin" in found, "".join(log)
        assert not any("died" in line for line in log), "".join(log)
        yield Web(found["public"], found["admin"], log)
    finally:
        process.terminate()
        process.wait(timeout=60)


def _answers(base: str | None) -> bool:
    if base is None:
        return False
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


async def _slow_client(host: str, port: int) -> tuple[float, bytes]:
    """Send a request's headers a line every 0.5 s, never finishing; (seconds until the server
    closed the connection, what it said)."""
    opened = time.monotonic()  # before connecting: the server's clock starts at its accept
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: clarion\r\n")
    said = b""
    try:
        for n in range(200):  # 100 s: far past any timeout
            try:
                chunk = await asyncio.wait_for(reader.read(1024), 0.5)
            except TimeoutError:
                writer.write(f"X-Slow-{n}: {'a' * 10}\r\n".encode())
                continue
            if not chunk:
                break
            said += chunk
    except ConnectionError:
        pass
    closed = time.monotonic() - opened
    writer.close()
    return closed, said


async def _health_latencies(base: str, stop: asyncio.Event) -> list[float]:
    latencies = []
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            started = time.monotonic()
            answer = await client.get(f"{base}/healthz")
            assert answer.status_code == 200
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.05)
    return latencies


async def _siege(base: str) -> tuple[list[tuple[float, bytes]], list[float]]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    stop = asyncio.Event()
    health = asyncio.create_task(_health_latencies(base, stop))
    slow = await asyncio.gather(*(_slow_client(host, int(port)) for _ in range(SLOW_CLIENTS)))
    stop.set()
    return slow, await health


def test_slow_header_clients_are_closed_within_the_timeout_while_healthz_answers(web):
    slow, health = asyncio.run(_siege(web.public))
    durations = sorted(d for d, _ in slow)
    print(
        f"\n{SLOW_CLIENTS} slow-header clients, --header-timeout {HEADER_TIMEOUT:g}: closed after "
        f"min {durations[0]:.2f} s, median {statistics.median(durations):.2f} s, "
        f"max {durations[-1]:.2f} s; /healthz meanwhile: {len(health)} answers, median "
        f"{statistics.median(health) * 1000:.0f} ms, max {max(health) * 1000:.0f} ms"
    )
    assert len(slow) == SLOW_CLIENTS
    assert all(said.startswith(b"HTTP/1.1 408 ") for _, said in slow), {s for _, s in slow}
    assert durations[0] >= HEADER_TIMEOUT - 0.1  # the timeout closed them, nothing earlier
    assert durations[-1] <= HEADER_TIMEOUT + SLACK
    assert len(health) >= 10 and max(health) < 1.0
    _crawling_second_request(web)


def _crawling_second_request(web: Web) -> None:
    """A kept-alive connection whose next request crawls is closed by the same timeout."""
    host, port = web.public.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: clarion\r\n\r\n")
        first = b""
        while not first.endswith(b'{"status":"ok"}'):
            first += conn.recv(4096)
        assert first.startswith(b"HTTP/1.1 200 ")
        conn.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request starts, then crawls
        started = time.monotonic()
        said = b""
        for _ in range(int((HEADER_TIMEOUT + SLACK) / 0.25) + 8):
            conn.settimeout(0.25)
            try:
                chunk = conn.recv(4096)
            except TimeoutError:
                conn.sendall(b"X: y\r\n")
                continue
            if not chunk:
                break
            said += chunk
        elapsed = time.monotonic() - started
    assert said.startswith(b"HTTP/1.1 408 ")
    assert HEADER_TIMEOUT - 0.1 <= elapsed <= HEADER_TIMEOUT + SLACK


def test_admin_routes_are_served_on_the_admin_listener_only(web):
    for path in ("/metrics", "/docs", "/openapi.json"):
        assert httpx.get(f"{web.public}{path}", timeout=30).status_code == 404, path
    assert httpx.get(f"{web.public}/healthz", timeout=30).json() == {"status": "ok"}
    assert httpx.get(f"{web.public}/readyz", timeout=30).status_code == 200
    metrics = httpx.get(f"{web.admin}/metrics", timeout=30)
    assert metrics.status_code == 200 and "# TYPE" in metrics.text
    doc = httpx.get(f"{web.admin}/openapi.json", timeout=30)
    assert doc.status_code == 200 and "/v1/events" in doc.json()["paths"]
    validate(doc.json())
    docs = httpx.get(f"{web.admin}/docs", timeout=30)
    assert docs.status_code == 200 and "'/openapi.json'" in docs.text
    assert httpx.get(f"{web.admin}/readyz", timeout=30).status_code == 200
    # the API is the public listener's: the admin one does not take events
    assert httpx.post(f"{web.admin}/v1/events", json={}, timeout=30).status_code == 404
    assert httpx.post(f"{web.public}/v1/events", json={}, timeout=30).status_code == 401
