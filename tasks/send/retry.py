"""The retry policy: data plus one pure function, used by every task that sends."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from clarion.errors import DeferredSendError, PermanentSendError, SendError


@dataclass(frozen=True)
class RetryPolicy:
    base: float = 2.0  # seconds before the second attempt
    factor: float = 3.0
    cap: float = 900.0  # never wait longer than this between attempts
    max_attempts: int = 8
    jitter: float = (
        0.2  # each delay is spread by ± this fraction, so retries of a burst do not align
    )


@dataclass(frozen=True)
class RetryDecision:
    delay: float  # seconds from now
    refund: bool = False  # nothing was attempted: the attempt does not count


def decide(
    error: SendError, attempt: int, policy: RetryPolicy, rand: Callable[[], float] = random.random
) -> RetryDecision | None:
    """Retry after a delay, or None to give up. `attempt` counts the attempt that just failed
    (1-based). A deferred send (a throttle: nothing was attempted) is always retried, refunded,
    after the provider's hint; the caller bounds how long that may go on."""
    hint = getattr(error, "retry_after", None)
    spread = 1 + policy.jitter * (2 * rand() - 1)
    if isinstance(error, DeferredSendError):
        delay = hint if hint is not None else policy.base
        return RetryDecision(min(policy.cap, delay * max(1.0, spread)), refund=True)
    if isinstance(error, PermanentSendError) or attempt >= policy.max_attempts:
        return None
    delay = min(policy.cap, policy.base * policy.factor ** (attempt - 1)) * spread
    if hint is not None:
        delay = max(delay, hint)
    return RetryDecision(min(policy.cap, delay))
