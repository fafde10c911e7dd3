"""tasks/retry.py: the pure retry decision."""

from __future__ import annotations

import pytest

from clarion.errors import (
    DeferredSendError,
    PermanentSendError,
    SendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.tasks.send.retry import RetryDecision, RetryPolicy, decide


def delay_of(decision: RetryDecision | None) -> float:
    """The delay of a decision to retry (None, give up, fails here)."""
    assert decision is not None
    return decision.delay


POLICY = RetryPolicy(base=2.0, factor=3.0, cap=900.0, max_attempts=8, jitter=0.0)


@pytest.mark.parametrize(
    ("error", "attempt"),
    [
        (PermanentSendError("http_410"), 1),
        (PermanentSendError("no_url"), 3),
        (TransientSendError("http_503"), 8),  # the last allowed attempt just failed
        (TransientSendError("http_503"), 9),
        (TransientSendError("http_429", retry_after=1.0), 8),
        (SendError("odd"), 8),
    ],
)
def test_gives_up(error: SendError, attempt: int) -> None:
    assert decide(error, attempt, POLICY) is None


@pytest.mark.parametrize(
    ("attempt", "delay"),
    [(1, 2.0), (2, 6.0), (3, 18.0), (4, 54.0), (5, 162.0), (6, 486.0), (7, 900.0)],
)
def test_backoff_grows_geometrically_up_to_the_cap(attempt: int, delay: float) -> None:
    assert decide(TransientSendError("http_503"), attempt, POLICY) == RetryDecision(delay)


def test_a_plain_send_error_is_retried_like_a_transient_one() -> None:
    assert decide(SendError("odd"), 2, POLICY) == RetryDecision(6.0)


def test_cap_holds_for_late_attempts_with_many_allowed() -> None:
    policy = RetryPolicy(base=1.0, factor=2.0, cap=60.0, max_attempts=100, jitter=0.0)
    delays = [delay_of(decide(TransientSendError("x"), n, policy)) for n in range(1, 100)]
    assert delays[:7] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert max(delays) == 60.0
    assert delays == sorted(delays)


@pytest.mark.parametrize(
    ("attempt", "hint", "delay"),
    [
        (1, 30.0, 30.0),  # hint raises the delay
        (1, 0.5, 2.0),  # a smaller hint never lowers it
        (1, 0.0, 2.0),
        (3, 18.0, 18.0),
        (2, 899.0, 899.0),
        (2, 901.0, 900.0),  # but never above the cap
        (1, 86400.0, 900.0),
        (1, float("inf"), 900.0),
        (7, 5.0, 900.0),  # capped backoff beats a small hint
    ],
)
def test_retry_after_hint(attempt: int, hint: float, delay: float) -> None:
    assert decide(
        TransientSendError("http_429", retry_after=hint), attempt, POLICY
    ) == RetryDecision(delay)


def test_max_attempts_one_never_retries() -> None:
    assert decide(TransientSendError("x"), 1, RetryPolicy(max_attempts=1)) is None


def test_an_unknown_outcome_is_retried_like_a_transient_one_and_counts() -> None:
    assert decide(UnknownSendError("no_answer"), 2, POLICY) == RetryDecision(6.0)
    assert decide(UnknownSendError("no_answer"), 8, POLICY) is None


@pytest.mark.parametrize("attempt", [1, 8, 20, 1000])
def test_a_throttle_is_refunded_and_never_gives_up(attempt: int) -> None:
    decision = decide(ThrottledError("paused", retry_after=7.0), attempt, POLICY)
    assert decision == RetryDecision(7.0, refund=True)
    assert decide(DeferredSendError("template_missing"), attempt, POLICY) == RetryDecision(
        2.0, refund=True
    )


@pytest.mark.parametrize(("rand", "spread"), [(0.0, 0.8), (0.5, 1.0), (1.0, 1.2)])
def test_jitter_spreads_each_delay_within_its_fraction(rand: float, spread: float) -> None:
    policy = RetryPolicy(base=10.0, factor=2.0, cap=900.0, jitter=0.2)
    assert delay_of(decide(TransientSendError("x"), 2, policy, rand=lambda: rand)) == pytest.approx(
        20.0 * spread
    )


def test_jittered_delays_differ_but_stay_in_bounds() -> None:
    delays = {
        delay_of(decide(TransientSendError("x"), 3, RetryPolicy(jitter=0.2))) for _ in range(200)
    }
    assert len(delays) > 100
    assert all(18.0 * 0.8 <= d <= 18.0 * 1.2 for d in delays)


def test_default_policy() -> None:
    policy = RetryPolicy(jitter=0.0)
    assert decide(TransientSendError("x"), 1, policy) == RetryDecision(policy.base)
    assert delay_of(decide(TransientSendError("x"), policy.max_attempts - 1, policy)) <= policy.cap
    assert decide(TransientSendError("x"), policy.max_attempts, policy) is None
