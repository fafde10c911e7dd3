"""Broker HA on rig hosts with Redis Sentinel (Debian's redis-server and redis-sentinel, `make
hosts-deps`): a master, a replica and three sentinels (quorum 2), spread over three hosts.

    ha = SentinelRedis(rig, folder, hosts=("broker1", "broker2", "broker3"))
    ha.start()                 # returns when the replica is in sync and every sentinel sees it all
    ha.url                     # sentinel://b1:26379;sentinel://b2:26379;sentinel://b3:26379/0
    old = ha.master(); rig.kill(old); ha.wait_master(other_than=old)

The master runs on the first host, the replica on the second, a sentinel on each; the third host
holds only a sentinel, so killing the master's host leaves two of three sentinels: a majority
that may elect a leader and promote the replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import redis

from tests.support.hosts import Rig

REDIS_SERVER = "/usr/bin/redis-server"
REDIS_SENTINEL = "/usr/bin/redis-sentinel"
PORT, SENTINEL_PORT = 6379, 26379
MASTER = "clarion"
# clarion's settings for a `url` of these sentinels, besides the URL itself: the master's name,
# and Redis's unacked messages back after 60 s (kombu's restore; the sweeper republishes what a
# failover lost from the database after CLARION_STRAY_AFTER anyway)
SENTINEL = {"CLARION_SENTINEL_MASTER": MASTER, "CLARION_VISIBILITY_TIMEOUT": "60"}
DOWN_AFTER_MS = 2000  # a master silent this long is subjectively down for a sentinel
FAILOVER_TIMEOUT_MS = 10000


class SentinelRedis:
    def __init__(self, rig: Rig, folder: Path, *, hosts: Sequence[str]) -> None:
        self.rig, self.folder, self.hosts = rig, folder, tuple(hosts)
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        """kombu's form (clarion/sentinel.py): every sentinel, database 0."""
        return (
            ";".join(f"sentinel://{self.rig.address(h)}:{SENTINEL_PORT}" for h in self.hosts) + "/0"
        )

    def _server(self, host: str, *extra: str) -> None:
        home = self.folder / host
        home.mkdir(exist_ok=True)
        address = self.rig.address(host)
        argv = [REDIS_SERVER, "--bind", address, "--port", str(PORT), "--protected-mode", "no"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(home), *extra]
        self.rig.start(host, argv, log=home / "redis.log")

    def _sentinel(self, host: str, master: str) -> None:
        home = self.folder / host
        home.mkdir(exist_ok=True)
        config = home / "sentinel.conf"  # the sentinel rewrites it as it learns
        config.write_text(
            f"port {SENTINEL_PORT}\nbind {self.rig.address(host)}\nprotected-mode no\n"
            f"dir {home}\n"
            f"sentinel monitor {MASTER} {self.rig.address(master)} {PORT} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {MASTER} 1\n"
        )
        self.rig.start(host, [REDIS_SENTINEL, str(config)], log=home / "sentinel.log")

    def start(self, timeout: float = 60) -> None:
        master, replica = self.hosts[0], self.hosts[1]
        self._server(master)
        self._server(replica, "--replicaof", self.rig.address(master), str(PORT))
        for host in self.hosts:
            self._sentinel(host, master)
        self._wait(self._settled, timeout, "the replica and the sentinels did not settle")

    def _settled(self) -> bool:
        try:
            info = self._node(self.hosts[1]).info("replication")
            if info.get("master_link_status") != "up":
                return False
            for host in self.hosts:
                state = cast(dict, self._sentinel_client(host).sentinel_master(MASTER))
                if state["num-slaves"] < 1 or state["num-other-sentinels"] < len(self.hosts) - 1:
                    return False
        except redis.RedisError:
            return False
        return True

    def _node(self, host: str) -> redis.Redis:
        return redis.Redis(self.rig.address(host), PORT, socket_timeout=2, socket_connect_timeout=2)

    def _sentinel_client(self, host: str) -> redis.Redis:
        return redis.Redis(
            self.rig.address(host), SENTINEL_PORT, socket_timeout=2, socket_connect_timeout=2
        )

    def master(self, asking: Sequence[str] | None = None) -> str | None:
        """The master's host as the first answering sentinel among `asking` reports it."""
        by_address = {self.rig.address(h): h for h in self.hosts}
        for host in asking or self.hosts:
            try:
                found = cast(
                    tuple, self._sentinel_client(host).sentinel_get_master_addr_by_name(MASTER)
                )
            except redis.RedisError:
                continue
            if found:
                address = found[0].decode() if isinstance(found[0], bytes) else str(found[0])
                return by_address.get(address, address)
        return None

    def wait_master(self, *, other_than: str, timeout: float = 60) -> str:
        """Wait until the surviving sentinels name another master and it answers as one."""
        asking = [h for h in self.hosts if h != other_than]
        promoted: list[str] = []

        def done() -> bool:
            found = self.master(asking)
            if found is None or found == other_than:
                return False
            try:
                if self._node(found).info("replication").get("role") != "master":
                    return False
            except redis.RedisError:
                return False
            promoted.append(found)
            return True

        self._wait(done, timeout, "no broker failover")
        return promoted[-1]

    def _wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.1)
        raise AssertionError(f"{what} after {timeout} s; see {self.folder}")
