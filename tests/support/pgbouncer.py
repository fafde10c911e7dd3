"""Debian's pgbouncer (`make hosts-deps`) in front of a PostgreSQL, in transaction pooling mode.

    with PgBouncer(folder, "postgresql://postgres@/postgres?host=/sockets") as bouncer:
        bouncer.url("clarion_t_1")   # the same database, through pgbouncer

It listens on 127.0.0.1 (or `listen`), passes every database name through to the server
(`* = ...`), trusts its clients (`auth_type = any`: it logs in as the server URL's user) and runs
as the `postgres` system user, or the owner of the server's socket folder (pgbouncer refuses root). Stopped by PID.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Self

from sqlalchemy import make_url

from clarion.ops import launch
from tests.support.services import free_port

PGBOUNCER = "/usr/sbin/pgbouncer"
USER = "postgres"


def unavailable() -> str | None:
    if not Path(PGBOUNCER).exists():
        return f"{PGBOUNCER} is missing: run `make hosts-deps`"
    return None


class PgBouncer:
    def __init__(
        self,
        folder: Path,
        server_url: str,
        *,
        listen: str = "127.0.0.1",
        pool_size: int = 20,
        command_prefix: tuple[str, ...] = (),
    ) -> None:
        """`command_prefix`: run it elsewhere (a rig host: `rig.command(host, [])`)."""
        self.folder, self.listen, self.port = folder, listen, free_port()
        server = make_url(server_url)
        host = str(server.host or server.query.get("host") or "127.0.0.1")
        self.user = server.username or USER
        # a server on a Unix socket: run as the owner of its folder (pgserver's is private)
        self.runs_as = Path(host).owner() if host.startswith("/") else USER
        folder.mkdir(parents=True, exist_ok=True)
        shutil.chown(folder, self.runs_as)
        target = f"host={host} port={server.port or 5432} user={self.user}"
        if server.password:
            target += f" password={server.password}"
        (folder / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = {target}\n"
            "[pgbouncer]\n"
            f"listen_addr = {listen}\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 2000\n"
            # psycopg sends extra_float_digits; nothing else may pass (no `options`)
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
            "server_check_delay = 1\nserver_login_retry = 1\n"
        )
        self.command = [
            *command_prefix,
            "setpriv",
            f"--reuid={self.runs_as}",
            f"--regid={self.runs_as}",
            "--init-groups",
            PGBOUNCER,
            str(folder / "pgbouncer.ini"),
        ]
        self.process: launch.Process | None = None

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@{self.listen}:{self.port}/{database}"

    def __enter__(self) -> Self:
        self.process = launch.Process(self.command, log=self.folder / "stdout.log")
        if not launch.wait_until(self._answers, 10):
            self.stop()
            raise RuntimeError(f"pgbouncer did not start: see {self.folder}")
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        if not self.process.alive():
            return False
        try:
            socket.create_connection((self.listen, self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
