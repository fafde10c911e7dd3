"""Start and stop real Celery worker and beat processes (for the demo, the tests and `clarion`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

QUEUES = ("transactional", "activation", "control")


def celery_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "tasks.app", *args]


def worker_command(queues: Sequence[str], *, concurrency: int = 2, name: str = "worker",
                   pool: str = "prefork", loglevel: str = "WARNING") -> list[str]:
    unknown = set(queues) - set(QUEUES)
    if unknown:
        raise ValueError(f"unknown lane(s): {', '.join(sorted(unknown))}; lanes are {', '.join(QUEUES)}")
    return celery_command(
        "worker", "-Q", ",".join(queues), "-c", str(concurrency), "-P", pool, "-n", f"{name}@%h",
        "--loglevel", loglevel, "--without-mingle", "--without-gossip",
    )


def beat_command(home: Path, loglevel: str = "WARNING") -> list[str]:
    return celery_command("beat", "--loglevel", loglevel, "-s", str(home / "celerybeat-schedule"))


class Process:
    """A child process in its own process group, so it and its pool children stop together."""

    def __init__(self, command: list[str], *, env: Mapping[str, str] | None = None,
                 log: Path | None = None, cwd: Path | None = None) -> None:
        self.command = command
        self.log = log
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
        self.popen = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)
        if log:
            out.close()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group: what a crashed machine looks like."""
        self._signal_group(signal.SIGKILL)
        self.popen.wait()

    def stop(self, timeout: float = 15) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it does not finish in time."""
        if not self.alive():
            self._signal_group(signal.SIGKILL)  # reap any orphaned pool children
            return
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)
        self._signal_group(signal.SIGKILL)
        self.popen.wait()

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
