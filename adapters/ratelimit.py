"""Provider rate limits shared by every worker: one module, used by every adapter.

A `Quota` is what a provider allows one credential (messages or segments per window, several
windows at once, e.g. Teams' 7/s + 8/2 s + 60/30 s + 1800/h per conversation). clarion spends
`share` of it (90% by default: the provider's own counting and our clocks are not exact), and the
activation lane at most `activation_share` of that, so a nudge backlog cannot starve receipts and
password resets on the same credential.

`RateLimits.take(quota, key, cost=…, lane=…)` spends `cost` (a message, or an SMS's segments)
from the budget of (provider, key) in Redis through the `limits` package's moving windows: no
window ever holds more than its amount, across all workers. A full budget, or one paused because
the provider answered 429, raises ThrottledError with the seconds to wait: the delivery is
deferred with its attempt refunded, never dropped. `pause` records a provider's Retry-After for
every worker.

`key` is the budget's scope, hashed before it reaches Redis: a credential (an API key, a sending
number), or whatever the provider counts by (a Teams conversation). Windows are measured on the
workers' clocks (`limits` stamps entries client-side), so hosts must keep NTP time.

Redis unreachable: `take` fails closed (ThrottledError, a short deferral) unless the quota says
`fail_open` (the chat channels: a limiter outage must not stop a manager's nudge).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis as redis_lib
from limits import RateLimitItemPerSecond
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

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

    def amounts(self, lane: str | None) -> list[tuple[int, int]]:
        """(amount, whole seconds) clarion may spend per window in `lane`. Windows shorter than a
        second are not representable in `limits`; they are scaled up to one second."""
        out = []
        for amount, seconds in self.windows:
            whole = max(1, math.ceil(seconds))
            allowed = amount * whole / seconds * self.share
            if lane == "activation":
                allowed *= self.activation_share
            out.append((max(1, math.floor(allowed)), whole))
        return out


def scope(key: str) -> str:
    """A budget key as it may appear in Redis: never a credential in clear."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:20]


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
        self.wall = wall
        self._storage: tuple[int, MovingWindowRateLimiter] | None = None

    def _limiter(self) -> MovingWindowRateLimiter:
        pid = os.getpid()
        if self._storage is None or self._storage[0] != pid:  # a forked child builds its own
            pool = self.redis().connection_pool
            storage = RedisStorage("redis://", connection_pool=pool, key_prefix=self.prefix)
            self._storage = (pid, MovingWindowRateLimiter(storage))
        return self._storage[1]

    def _pause_key(self, quota: Quota, key: str) -> str:
        return f"{self.prefix}:pause:{quota.provider}:{scope(key)}"

    def take(self, quota: Quota, key: str, *, cost: int = 1, lane: str | None = None) -> None:
        """Spend `cost` from the budget, or raise ThrottledError saying how long to wait."""
        try:
            self._take(quota, key, max(1, cost), lane)
        except redis_lib.RedisError as exc:
            if quota.fail_open:
                log.warning("rate budget unavailable", extra={"action": "rate_limit_open"})
                return
            raise ThrottledError(
                "budget_unavailable",
                f"{quota.provider} rate budget unreadable: {exc}"[:200],
                retry_after=OUTAGE_DEFERRAL,
            ) from exc

    def _take(self, quota: Quota, key: str, cost: int, lane: str | None) -> None:
        paused = self.paused_for(quota, key)
        if paused:
            raise ThrottledError(
                "paused", f"{quota.provider} asked to wait {paused:.1f}s more", retry_after=paused
            )
        limiter, ident = self._limiter(), (quota.provider, scope(key))
        checks: list[tuple[RateLimitItemPerSecond, tuple[str, ...]]] = []
        if lane == "activation":  # the lane's own share first, then the credential's whole budget
            checks += [(_item(a, s), (*ident, "activation")) for a, s in quota.amounts(lane)]
        checks += [(_item(a, s), ident) for a, s in quota.amounts(None)]
        for item, ids in checks:
            if cost > item.amount:
                raise ThrottledError(
                    "over_budget", f"cost {cost} exceeds {quota.provider}'s window of {item.amount}"
                )
            if not limiter.hit(item, *ids, cost=cost):
                reset = limiter.get_window_stats(item, *ids).reset_time
                wait = min(float(item.get_expiry()), max(0.05, reset - time.time()))
                raise ThrottledError(
                    "budget_full",
                    f"{quota.provider} budget of {item.amount} per {item.get_expiry()}s is spent",
                    retry_after=wait,
                )

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


def _item(amount: int, seconds: int) -> RateLimitItemPerSecond:
    return RateLimitItemPerSecond(amount, seconds)
