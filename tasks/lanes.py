"""Lane budgets: how fast the activation lane may route and send, across every worker.

Lanes have their own queues and workers, so a nudge backlog never waits in front of a receipt; but
they share PostgreSQL, Redis and, on a small deployment, the hosts' CPUs. Routed and sent flat out,
a 100k-nudge backlog takes every spare cycle of the database, and receipts slow down with it.
`CLARION_ACTIVATION_PER_SECOND` caps the activation lane's routing, cluster-wide, and so the sends
that follow from it: the capacity it leaves is the transactional lane's headroom (bench/latency.py
measures the difference). Unset, the lane goes as fast as its workers do.

A budget is one Redis key per lane holding a GCRA "theoretical arrival time", advanced by one Lua
script on **Redis's clock**. The route task takes a budgeted lane's batch in slices of about SLICE
seconds of budget; after a slice commits, it reserves the requests it actually resolved (a
redelivered message whose requests are done costs nothing), waits the reservation out, and sends
the slice's deliveries itself (tasks.deliver.deliver_now): published instead, they would queue
behind the rest of the lane's route backlog. Across all workers the lane never runs ahead of its
rate by more than BURST seconds' worth. Nothing is locked while it waits; a process that dies
waiting or sending leaves committed deliveries to the tick and the claim leases, as any deliver
task does. Deliveries published later (held by a gate, retried, taken over) are not paced: they
were admitted already. Redis unreachable: the budget fails open — it protects our own capacity,
not a provider's quota (provider quotas are adapters/ratelimit.py, and fail closed).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import kombu
import redis as redis_lib

from clarion import sentinel, settings
from clarion.names import QUEUES
from clarion.tasks import runtime

log = logging.getLogger(__name__)

SLICE = 0.1  # seconds of budget claimed and sent at a time
BURST = 0.1  # seconds of budget an idle lane may spend at once
KEY = "clarion:lane:{lane}:tat"

# KEYS[1]: the lane's theoretical arrival time (µs, Redis TIME). ARGV: rows, µs per row, burst µs.
# Returns µs to wait before the reserved rows may go (0: at once).
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
tat = tat + tonumber(ARGV[1]) * tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
local wait = tat - now - tonumber(ARGV[3])
if wait < 0 then wait = 0 end
return string.format('%.0f', wait)
"""


def rate(lane: str | None) -> float | None:
    """Sends per second the lane may make, or None: no budget."""
    return settings.get().activation_per_second if lane == "activation" else None


def reserve(lane: str, rows: int, per_second: float) -> float:
    """Reserve `rows` sends of the lane's budget; the seconds to wait before making them."""
    try:
        wait = runtime.redis().eval(
            _RESERVE,
            1,
            KEY.format(lane=lane),
            rows,
            f"{1_000_000 / per_second:.3f}",
            int(BURST * 1_000_000),
        )
    except redis_lib.RedisError:
        log.warning("lane budget unavailable", extra={"action": "lane_budget_open", "lane": lane})
        return 0.0
    return float(wait) / 1_000_000


def slices(lane: str | None, keys: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """A batch's keys in the slices it is routed in: about SLICE seconds of the lane's budget
    each, or the whole batch for a lane without one."""
    per_second = rate(lane)
    size = len(keys) if per_second is None else max(1, math.ceil(per_second * SLICE))
    return [keys[i : i + size] for i in range(0, len(keys), max(1, size))]


def wait_turn(lane: str | None, rows: int, *, sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until `rows` more requests of the lane may go on under its budget; returns the seconds
    waited (at most for the slices reserved before these, across all workers)."""
    per_second = rate(lane)
    if per_second is None or lane is None or rows <= 0:
        return 0.0
    wait = reserve(lane, rows, per_second)
    if wait > 0:
        sleep(wait)
    return wait


def queue_depths(broker_url: str) -> list[tuple[str, int, int | str]]:
    """(queue, messages waiting, consumers) for each clarion queue, on any kombu broker. Redis
    keeps no key for an empty queue and knows nothing of consumers, so there an absent queue is
    empty and consumers are not known ("?")."""
    rows: list[tuple[str, int, int | str]] = []
    options = sentinel.transport_options(broker_url, settings.get().sentinel_master)
    with kombu.Connection(broker_url, connect_timeout=5, transport_options=options) as conn:
        redis_broker = conn.transport.driver_type == "redis"
        channel = conn.channel()
        for queue in QUEUES:
            try:
                found = channel.queue_declare(queue=queue, passive=True)
                consumers: int | str = "?" if redis_broker else found.consumer_count
                rows.append((queue, found.message_count, consumers))
            except conn.channel_errors:  # Redis: empty; AMQP: no worker has declared it yet
                rows.append((queue, 0, "?" if redis_broker else 0))
                channel = conn.channel()
    return rows
