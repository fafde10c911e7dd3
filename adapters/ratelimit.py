"""Provider rate limits shared by every worker: one module, used by every adapter.

A `Quota` is what a provider allows one credential (messages or segments per window, several
windows at once, e.g. Teams' 7/s + 8/2 s + 60/30 s + 1800/h per conversation). clarion spends
`share` of it (90% by default: the provider's own counting and our clocks are not exact), and the
activation lane at most `activation_share` of that, so a nudge backlog cannot starve receipts and
password resets on the same credential.

`RateLimits.take(quota, key, cost=…, lane=…)` spends `cost` (a message, or an SMS's segments)
from the budget of (provider, key): a sliding log per window in Redis, checked and charged for
every window at once by one Lua script stamped with **Redis's own clock** (`TIME`), so no window
ever holds more than its amount across all workers and hosts, whatever their clocks or however
late a descheduled process gets to Redis. (The `limits` package's moving window stamps entries with
the caller's clock: measured here, four processes on two cores put 12 into a 10-per-second window.)
A full budget, or one paused because the provider answered 429, raises ThrottledError with the
seconds to wait: the delivery is deferred with its attempt refunded, never dropped. `pause`
records a provider's Retry-After for every worker.

`key` is the budget's scope, hashed before it reaches Redis: a credential (an API key, a sending
number), or whatever the provider counts by (a Teams conversation). A budget's keys, its pause
included, share one Redis Cluster hash slot, so one script checks the pause and charges every
window: one round trip per take.

Redis unreachable: `take` fails closed (ThrottledError, a short deferral) unless the quota says
`fail_open` (the chat channels: a limiter outage must not stop a manager's nudge).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis as redis_lib

from clarion.errors import ThrottledError

log = logging.getLogger(__name__)

OUTAGE_DEFERRAL = 2.0  # seconds a delivery waits when the budget cannot be read


@dataclass(frozen=True)
class Quota:
    """What a provider allows per budget key: (amount, seconds) windows, all of which hold."""

    provider: str
    windows: tuple[tuple[int, float], ...]
    share: float = 0.9
    activation_share: float = 0.5
    fail_open: bool = False

    def __post_init__(self) -> None:
        if not self.windows or any(a < 1 or s <= 0 for a, s in self.windows):
            raise ValueError(f"{self.provider}: quota windows must be positive, not {self.windows}")
        if not (0 < self.share <= 1 and 0 < self.activation_share <= 1):
            raise ValueError(f"{self.provider}: shares must be in (0, 1]")

    def amounts(self, lane: str | None) -> list[tuple[int, float]]:
        """(amount, seconds) clarion may spend per window in `lane`."""
        out = []
        for amount, seconds in self.windows:
            allowed = amount * self.share
            if lane == "activation":
                allowed *= self.activation_share
            out.append((max(1, math.floor(allowed)), seconds))
        return out


def scope(key: str) -> str:
    """A budget key as it may appear in Redis: never a credential in clear."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:20]


# KEYS: the budget's pause, then one sorted set per window (score: Redis TIME in µs). ARGV: cost, a
# unique member prefix, clarion's clock (epoch s, what a pause is stored on), then (amount, window
# µs) per window. Returns ['paused', seconds left] or [µs until the full window has room (0:
# charged to every window), Redis's time in µs]. Lua numbers come back as integers, hence strings.
_TAKE = """
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if held > tonumber(ARGV[3]) then return {'paused', tostring(held - tonumber(ARGV[3]))} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[1])
local wait = 0
for i = 2, #KEYS do
  local amount, window = tonumber(ARGV[2 * i]), tonumber(ARGV[1 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - window)
  local over = redis.call('ZCARD', KEYS[i]) + cost - amount
  if over > 0 then
    local oldest = redis.call('ZRANGE', KEYS[i], over - 1, over - 1, 'WITHSCORES')
    local free = tonumber(oldest[2]) + window - now
    if free > wait then wait = free end
  end
end
if wait > 0 then return {tostring(wait), tostring(now)} end
for i = 2, #KEYS do
  for j = 1, cost do redis.call('ZADD', KEYS[i], now, ARGV[2] .. ':' .. j) end
  redis.call('PEXPIRE', KEYS[i], math.ceil(tonumber(ARGV[1 + 2 * i]) / 1000) + 1000)
end
return {'0', tostring(now)}
"""


class RateLimits:
    """Budgets in Redis, shared by every worker process (see the module docstring)."""

    def __init__(
        self,
        redis: Callable[[], redis_lib.Redis],
        *,
        prefix: str = "clarion:rl",
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.wall = wall  # for pauses only: a provider's Retry-After, on clarion's clock

    def _slot(self, quota: Quota, key: str) -> str:
        """The prefix of every key of one budget, its pause included: one Redis Cluster hash slot,
        so one script reads and charges them all."""
        return f"{self.prefix}:{{{quota.provider}:{scope(key)}}}"

    def _pause_key(self, quota: Quota, key: str) -> str:
        return f"{self._slot(quota, key)}:pause"

    def take(
        self, quota: Quota, key: str, *, cost: int = 1, lane: str | None = None
    ) -> float | None:
        """Spend `cost` from the budget, or raise ThrottledError saying how long to wait. Returns
        the time (Redis's clock, epoch seconds) the budget was charged at; None if Redis could
        not be asked and the quota fails open."""
        try:
            return self._take(quota, key, max(1, cost), lane)
        except redis_lib.RedisError as exc:
            if quota.fail_open:
                log.warning("rate budget unavailable", extra={"action": "rate_limit_open"})
                return None
            raise ThrottledError(
                "budget_unavailable",
                f"{quota.provider} rate budget unreadable: {exc}"[:200],
                retry_after=OUTAGE_DEFERRAL,
            ) from exc

    def _take(self, quota: Quota, key: str, cost: int, lane: str | None) -> float:
        """One round trip: the pause and every window, read and charged by one script."""
        slot = self._slot(quota, key)
        windows = [(f"{slot}:{i}", a, s) for i, (a, s) in enumerate(quota.amounts(None))]
        if lane == "activation":  # the lane's own share, and the credential's whole budget
            windows += [(f"{slot}:a{i}", a, s) for i, (a, s) in enumerate(quota.amounts(lane))]
        smallest = min(a for _, a, _ in windows)
        if cost > smallest:
            raise ThrottledError(
                "over_budget", f"cost {cost} exceeds {quota.provider}'s window of {smallest}"
            )
        args: list[str | int] = [cost, uuid.uuid4().hex, repr(self.wall())]
        for _, amount, seconds in windows:
            args += [amount, int(seconds * 1_000_000)]
        keys = [self._pause_key(quota, key), *[w[0] for w in windows]]
        first, second = cast(list[bytes], self.redis().eval(_TAKE, len(keys), *keys, *args))
        if first == b"paused":
            paused = float(second)
            raise ThrottledError(
                "paused", f"{quota.provider} asked to wait {paused:.1f}s more", retry_after=paused
            )
        wait, at = float(first), float(second)
        if wait > 0:
            full = min(windows, key=lambda w: w[1])
            raise ThrottledError(
                "budget_full",
                f"{quota.provider} budget of {full[1]} per {full[2]:g}s is spent",
                retry_after=max(0.01, wait / 1_000_000),
            )
        return at / 1_000_000

    def pause(self, quota: Quota, key: str, seconds: float) -> None:
        """Hold the budget for `seconds` (a 429's Retry-After), never shortening a longer pause."""
        until = self.wall() + max(0.0, seconds)
        name = self._pause_key(quota, key)
        try:
            current = cast(bytes | None, self.redis().get(name))
            if current is None or float(current) < until:
                self.redis().set(name, repr(until), px=max(1, int(seconds * 1000) + 1000))
        except redis_lib.RedisError:
            log.warning("pause not stored", extra={"action": "rate_pause_lost"})

    def paused_for(self, quota: Quota, key: str) -> float | None:
        """Seconds the budget is still paused for, or None."""
        raw = cast(bytes | None, self.redis().get(self._pause_key(quota, key)))
        left = float(raw) - self.wall() if raw else 0.0
        return left if left > 0 else None
