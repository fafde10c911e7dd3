"""Start and stop real Celery worker and beat processes (for the demo, the tests and `clarion`)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clarion.names import QUEUES

REFUSED = 2  # a worker's exit status when it refused to start (tasks.app): restarting cannot help
UNAVAILABLE = 75  # its broker or database was not there (tasks.startup): start it again later
COLD_STOP = 10.0  # seconds a cold-stopped worker gets to leave before its group is SIGKILLed
log = logging.getLogger("clarion.supervisor")


def celery_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "clarion", *args]


def worker_command(
    queues: Sequence[str],
    *,
    concurrency: int = 2,
    name: str = "worker",
    pool: str = "prefork",
    loglevel: str = "WARNING",
) -> list[str]:
    unknown = set(queues) - set(QUEUES)
    if unknown:
        raise ValueError(
            f"unknown lane(s): {', '.join(sorted(unknown))}; lanes are {', '.join(QUEUES)}"
        )
    return celery_command(
        "worker",
        "-Q",
        ",".join(queues),
        "-c",
        str(concurrency),
        "-P",
        pool,
        "-n",
        name if "@" in name else f"{name}@%h",
        "--loglevel",
        loglevel,
        "--without-mingle",
        "--without-gossip",
    )


def beat_command(home: Path, loglevel: str = "WARNING", *, quiet: bool = False) -> list[str]:
    """`quiet`: without beat's plain-text start banner (CLARION_LOG_FORMAT=json)."""
    schedule = str(home / "celerybeat-schedule")
    return celery_command(
        *(["--quiet"] if quiet else []), "beat", "--loglevel", loglevel, "-s", schedule
    )


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def _die_with_parent() -> None:
    """In the child, before exec: the stop signals at their defaults (an ignored signal stays
    ignored across exec: a supervisor started under `nohup`, or from a process that ignores SIGQUIT,
    would otherwise hand its worker a cold stop that does nothing); and be SIGKILLed when the parent
    dies (Linux PR_SET_PDEATHSIG), so a supervisor killed outright leaves no worker behind to run
    unsupervised beside its successor."""
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


class Process:
    """A child process in its own process group, so it and its pool children stop together."""

    def __init__(
        self,
        command: list[str],
        *,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        cwd: Path | None = None,
        inherit_output: bool = False,
        die_with_parent: bool = False,
    ) -> None:
        self.command = command
        self.log = log
        log_file = open(log, "ab") if log else None  # noqa: SIM115
        out = log_file if log_file is not None else None if inherit_output else subprocess.DEVNULL
        self.popen = subprocess.Popen(
            command,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=None if inherit_output else subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
        if log_file is not None:
            log_file.close()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group: what a crashed machine looks like."""
        self.signal_group(signal.SIGKILL)
        self.popen.wait()

    def stop(self, timeout: float = 15) -> None:
        """Warm shutdown (SIGTERM to the main process only: a Celery worker lets its pool finish
        the running tasks), then SIGKILL to the group if it does not finish in time."""
        if not self.alive():
            self.signal_group(signal.SIGKILL)  # reap any orphaned pool children
            return
        self.signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)
        self.signal_group(signal.SIGKILL)
        self.popen.wait()

    def signal(self, sig: int) -> None:
        """`sig` to the main process alone (not its pool children)."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@dataclass(frozen=True)
class Backoff:
    """Restart delays: first, doubled after each quick exit up to most; back to first once a run
    lasted `stable` seconds."""

    first: float = 1.0
    most: float = 30.0
    stable: float = 60.0

    def next(self, previous: float | None, ran: float) -> float:
        """The delay before the next start, after a run of `ran` seconds."""
        if previous is None or ran >= self.stable:
            return self.first
        return min(self.most, max(self.first, previous * 2))


class Supervisor:
    """Run a command (a celery worker) and start it again whenever it exits unexpectedly.

    A kombu 5.7 worker can die on a Redis restart (restore_unacked -> _connparams: AttributeError)
    and does not come back by itself. An exit with UNAVAILABLE (its broker or database did not
    answer within CLARION_START_WAIT) is retried like a crash; one with REFUSED (wrong config, bad
    catalog, unmigrated database) is final.

    Stopping: the first SIGTERM or SIGINT is a warm shutdown: SIGTERM to the Celery main process
    only (never its pool children, which would die mid-task: WorkerLostError), so running tasks
    finish; after `stop_timeout` seconds (CLARION_SHUTDOWN_GRACE), or at a second SIGTERM/SIGINT,
    a cold one: SIGQUIT to the main process, and SIGKILL to the group COLD_STOP seconds later."""

    def __init__(
        self,
        command: list[str],
        *,
        env: Mapping[str, str] | None = None,
        backoff: Backoff = Backoff(),
        stop_timeout: float = 60.0,
    ) -> None:
        self.command, self.env, self.backoff, self.stop_timeout = (
            command,
            env,
            backoff,
            stop_timeout,
        )
        self.stop_signal: int | None = None  # set by the handler only: no locks in a signal handler
        self.stop_signals = 0  # how many arrived: the second means stop cold now
        self.starts = 0
        self.child: Process | None = None

    def run(self) -> int:
        """Supervise until stopped; returns the exit status to leave with."""
        self._handle_signals()
        delay: float | None = None
        while True:
            started, code = time.monotonic(), self._run_once()
            if self.stopping:
                log.info("worker stopped", extra={"action": "worker_stopped", "exit": code})
                return 0 if code in (0, -signal.SIGTERM) else 1
            if code == REFUSED:
                log.error(
                    "worker refused to start; not restarting", extra={"action": "worker_refused"}
                )
                return REFUSED
            if code == UNAVAILABLE:
                log.warning(
                    "worker's broker or database is not there yet",
                    extra={"action": "worker_unavailable"},
                )
            delay = self.backoff.next(delay, time.monotonic() - started)
            log.warning(
                "worker exited with %s; restarting in %.1f s",
                code,
                delay,
                extra={
                    "action": "worker_restarting",
                    "exit": code,
                    "delay": delay,
                    "starts": self.starts,
                },
            )
            if self._sleep(delay):
                return 0

    @property
    def stopping(self) -> bool:
        return self.stop_signal is not None

    def _sleep(self, seconds: float) -> bool:
        """Wait, unless told to stop; True if told to stop."""
        until = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < until:
            time.sleep(0.1)
        return self.stopping

    def _run_once(self) -> int:
        self.starts += 1
        self.child = Process(self.command, env=self.env, inherit_output=True, die_with_parent=True)
        warm: float | None = None  # when the warm stop began
        cold: float | None = None  # when the cold stop began
        while (code := self.child.popen.poll()) is None:
            now = time.monotonic()
            if self.stop_signal is not None and warm is None:  # i.e. self.stopping
                log.info(
                    "stopping the worker warmly (%s): running tasks finish, at most %g s",
                    signal.Signals(self.stop_signal).name,
                    self.stop_timeout,
                    extra={"action": "worker_stopping", "grace": self.stop_timeout},
                )
                self.child.signal(signal.SIGTERM)
                warm = now
            if cold is None and warm is not None:
                why = "second signal" if self.stop_signals > 1 else None
                if why is None and now - warm > self.stop_timeout:
                    why = f"grace of {self.stop_timeout:g} s over"
                if why is not None:
                    log.warning(
                        "stopping the worker cold (%s)", why, extra={"action": "worker_cold_stop"}
                    )
                    self.child.signal(signal.SIGQUIT)  # Celery's cold shutdown
                    cold = now
            if cold is not None and now - cold > COLD_STOP:
                self.child.signal_group(signal.SIGKILL)
            time.sleep(0.1)
        self.child.signal_group(signal.SIGKILL)  # pool children the worker left behind
        return code

    def _handle_signals(self) -> None:
        def stop(signum: int, _frame: object) -> None:
            self.stop_signal = self.stop_signal or signum
            self.stop_signals += 1

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)


def supervise(
    command: list[str],
    *,
    env: Mapping[str, str] | None = None,
    backoff: Backoff = Backoff(),
    stop_timeout: float = 60.0,
) -> int:
    """Run `command` under a Supervisor until SIGTERM/SIGINT; the exit status to leave with."""
    return Supervisor(command, env=env, backoff=backoff, stop_timeout=stop_timeout).run()
