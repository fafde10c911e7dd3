"""Redis behind Redis Sentinel: one URL form for the broker and for clarion's own Redis.

    CLARION_BROKER_URL='sentinel://s1:26379;sentinel://s2:26379;sentinel://s3:26379/0'
    CLARION_REDIS_URL= (the same)       CLARION_SENTINEL_MASTER=clarion

The form is kombu's (`sentinel://` transport): each sentinel separated by `;`, the database after
the last one's `/`, an optional password as in `sentinel://:secret@s1:26379`. Kombu takes the
master's name from its transport options (`transport_options` here, which celeryconfig.py uses
as `broker_transport_options`); clarion's own Redis (rate budgets, circuit state, lane budgets,
counters) asks the same sentinels for the same master through redis-py's `Sentinel`, so after a
failover both follow the promoted replica instead of waiting for a master that is gone.

Following a failover: redis-py (8.1, redis/redis-py#3874) asks the sentinels for the master only
when a connection is opened through `connect()`; a connection that broke mid-command reconnects
through `connect_check_health()` to the host it had, the old master, for as long as the process
runs. `FollowingConnection` asks the sentinels there too, for clarion's own Redis and (set on
kombu's Sentinel channel when this module is imported: celeryconfig.py does) for the broker.

Timeouts: a master whose host vanished answers nothing (no RST), so without them a publish or a
budget check would wait for TCP's own timeouts (minutes). Set here for Sentinel URLs only; a
plain redis:// keeps kombu's and redis-py's defaults.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis as redis_lib
from kombu.transport import redis as kombu_redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from clarion.errors import ConfigurationError

SCHEME = "sentinel://"
SOCKET_TIMEOUT = 5.0  # seconds a command on the master (or a sentinel's answer) may take
CONNECT_TIMEOUT = 3.0  # seconds to open a connection to the master or a sentinel
SENTINEL_TIMEOUT = 1.0  # a live sentinel on the LAN answers within milliseconds
HEALTH_CHECK = 5  # kombu: a BRPOP connection with no reply this long past its timeout is dropped


class FollowingConnection(SentinelManagedConnection):
    """A master's connection that asks the sentinels where the master is whenever it opens."""

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if self._sock:
            return
        if self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health, retry_socket_connect)

    def connect_to(self, address: tuple[str, int]) -> None:
        """SentinelManagedConnection's, which has just asked: open without asking again."""
        self.host, self.port = address
        SentinelManagedConnection.connect_check_health(
            self, check_health=self.connection_pool.check_connection, retry_socket_connect=False
        )


kombu_redis.SentinelChannel.connection_class = FollowingConnection


def is_sentinel(url: str | None) -> bool:
    return bool(url) and str(url).startswith(SCHEME)


def parse(url: str, setting: str = "the URL") -> tuple[list[tuple[str, int]], int, str | None]:
    """(sentinels as (host, port), database, password) of a sentinel:// URL; ConfigurationError
    naming the setting and what is wrong (kombu would only fail at the first connection)."""
    sentinels: list[tuple[str, int]] = []
    db, password = 0, None
    for part in url.split(";"):
        parts = urlsplit(part.strip())
        if parts.scheme != "sentinel" or not parts.hostname:
            raise ConfigurationError(
                f"{setting}: {part!r} is not sentinel://host:port (sentinels are separated by ';')"
            )
        try:
            port = parts.port or 26379
        except ValueError as exc:
            raise ConfigurationError(f"{setting}: {part!r}: the port is not a number") from exc
        sentinels.append((parts.hostname, port))
        password = unquote(parts.password) if parts.password else password
        path = parts.path.strip("/")
        if path:
            if not path.isdigit():
                raise ConfigurationError(
                    f"{setting}: {part!r}: the database after '/' must be a number"
                )
            db = int(path)
    return sentinels, db, password


def transport_options(url: str | None, master: str | None) -> dict[str, Any]:
    """Kombu transport options a sentinel:// broker needs (none for another broker)."""
    if not is_sentinel(url):
        return {}
    return {
        "master_name": master,
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_keepalive": True,
        "health_check_interval": HEALTH_CHECK,
        "retry_on_timeout": True,
        "sentinel_kwargs": sentinel_kwargs(),
    }


def sentinel_kwargs() -> dict[str, Any]:
    """How a sentinel is asked: once, briefly. Asking for the master walks the list of sentinels,
    so the next one is the retry; redis-py's default of 3 retries with backoff per sentinel made a
    dead sentinel cost each reconnect tens of seconds (measured: a worker stalled 2 minutes)."""
    return {
        "socket_timeout": SENTINEL_TIMEOUT,
        "socket_connect_timeout": SENTINEL_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
    }


def client(url: str, master: str | None, **kwargs: Any) -> redis_lib.Redis:
    """A Redis client for `url`: the current master of `master` for a sentinel:// URL (each
    new connection asks the sentinels, so a failover is followed), else redis.Redis.from_url."""
    if not is_sentinel(url):
        return redis_lib.Redis.from_url(url, **kwargs)
    if not master:
        raise ConfigurationError(
            "a sentinel:// Redis URL needs CLARION_SENTINEL_MASTER (the master's name "
            "in the sentinels' configuration)"
        )
    sentinels, db, password = parse(url)
    timeouts = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": CONNECT_TIMEOUT}
    # A command that timed out is tried again on the master the sentinels name then: a rate
    # budget may be charged twice (fewer sends, never more), a counter bumped twice.
    options = timeouts | {"socket_keepalive": True, "retry_on_timeout": True} | kwargs
    watchers = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs(), **timeouts)  # type: ignore[no-untyped-call]
    found = watchers.master_for(  # type: ignore[no-untyped-call]
        master, db=db, password=password, connection_class=FollowingConnection, **options
    )
    return cast(redis_lib.Redis, found)


OPTION_NAMES = frozenset(transport_options(SCHEME, "-"))  # what a switch of broker drops
