"""The retry policy: data plus one pure function, used by every task that sends."""

from __future__ import annotations

from dataclasses import dataclass

from clarion.errors import PermanentSendError, SendError


@dataclass(frozen=True)
class RetryPolicy:
    base: float = 2.0  # seconds before the second attempt
    factor: float = 3.0
    cap: float = 900.0  # never wait longer than this between attempts
    max_attempts: int = 8


@dataclass(frozen=True)
class RetryDecision:
    delay: float  # seconds from now


def decide(error: SendError, attempt: int, policy: RetryPolicy) -> RetryDecision | None:
    """Retry after a delay, or None to give up. `attempt` counts the attempt that just failed (1-based)."""
    if isinstance(error, PermanentSendError) or attempt >= policy.max_attempts:
        return None
    delay = min(policy.cap, policy.base * policy.factor ** (attempt - 1))
    hint = getattr(error, "retry_after", None)
    if hint is not None:
        delay = min(policy.cap, max(delay, hint))
    return RetryDecision(delay)
