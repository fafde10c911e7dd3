"""Real worker and beat processes for acceptance tests, plus waiting on the ledger."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import text

from clarion.db.engine import engine
from clarion.ops import launch


class Cluster:
    """Worker and beat processes sharing one environment; each can be killed and restarted."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.logs.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, launch.Process] = {}
        self.commands: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.starts = 0

    def worker(
        self,
        name: str,
        queues: Sequence[str] = launch.QUEUES,
        *,
        concurrency: int = 2,
        pool: str = "prefork",
        env: dict[str, str] | None = None,
        loglevel: str = "INFO",
    ) -> None:
        command = launch.worker_command(
            queues, concurrency=concurrency, name=name, pool=pool, loglevel=loglevel
        )
        self._start(name, command, env or {})

    def beat(self, name: str = "beat") -> None:
        home = Path(self.env["CLARION_HOME"]) / name
        home.mkdir(parents=True, exist_ok=True)
        self._start(name, launch.beat_command(home), {})

    def _start(self, name: str, command: list[str], extra: dict[str, str]) -> None:
        self.starts += 1
        self.commands[name] = (command, extra)
        self.processes[name] = launch.Process(
            command, env={**self.env, **extra}, log=self.logs / f"{name}.{self.starts}.log"
        )

    def kill(self, name: str) -> None:
        self.processes[name].kill()

    def restart(self, name: str) -> None:
        command, extra = self.commands[name]
        self._start(name, command, extra)

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop()

    def stop_together(self) -> None:
        """Stop every process side by side: a warm shutdown takes seconds each."""
        stoppers = [threading.Thread(target=p.stop) for p in self.processes.values()]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()

    def wait_ready(self, names: Sequence[str], timeout: float) -> None:
        """Wait until each named worker's log says it is ready; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = {
                n
                for n in names
                if any(
                    " ready." in p.read_text(errors="replace") for p in self.logs.glob(f"{n}.*.log")
                )
            }
            if ready == set(names):
                return
            time.sleep(0.2)
        raise AssertionError(f"workers not ready after {timeout} s: see {self.logs}")


def children(pid: int) -> list[int]:
    """The child processes of `pid` (a Celery worker's pool processes), none if it is gone."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def counts(sql: str) -> int:
    with engine().connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def wait_settled(timeout: float, *, expect_sent: int | None = None) -> bool:
    """Wait until no request is unrouted and no delivery is pending or claimed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        unrouted = counts("SELECT count(*) FROM requests WHERE state <> 'routed'")
        unsettled = counts("SELECT count(*) FROM deliveries WHERE state IN ('pending', 'claimed')")
        sent = counts("SELECT count(*) FROM deliveries WHERE state = 'sent'")
        if unrouted == 0 and unsettled == 0 and (expect_sent is None or sent >= expect_sent):
            return True
        time.sleep(0.5)
    return False


def mixed_requests(users: int, per_user: int) -> list[dict]:
    """`users * per_user` distinct occurrences: odd ones activation nudges (occurrence keys),
    even ones transactional receipts (event ids)."""
    items = []
    for u in range(users):
        for n in range(per_user):
            if n % 2:
                kind = dict(
                    type_key="nudge", occurrence_key=f"nudge:{n}", variables={"name": f"N{u}"}
                )
            else:
                kind = dict(
                    type_key="receipt", event_id=f"order-{u}-{n}", variables={"order": f"{u}-{n}"}
                )
            items.append(dict(user_id=f"u{u}", **kind))
    return items


def occurrence(item: dict) -> str:
    """The receiver's key for one of `mixed_requests`' items: user/type/occurrence."""
    key = item.get("occurrence_key") or f"event:{item['event_id']}"
    return f"{item['user_id']}/{item['type_key']}/{key}"
