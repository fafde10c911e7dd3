"""clarion/drain.py: a queue drained on its own thread, lingering for more after the first item."""

from __future__ import annotations

import time

from clarion.drain import Drain


def test_items_put_together_are_handled_in_one_call_after_the_linger() -> None:
    calls: list[list[int]] = []
    drain: Drain[int] = Drain("test-drain", calls.append, linger=0.05)
    for n in range(3):
        drain.put(n)
    assert drain.settle(10)
    assert calls == [[0, 1, 2]]
    assert drain.waiting() == 0


def test_settle_cuts_the_linger_short() -> None:
    """Whoever waits in settle() has nothing more to add: the drain hands over at once instead of
    lingering (a broadcast's fan-out waited the publisher's 20 ms linger at the end of every task)."""
    calls: list[list[int]] = []
    drain: Drain[int] = Drain("test-drain", calls.append, linger=30.0)
    drain.put(1)
    began = time.monotonic()
    assert drain.settle(10), "settle waited out the linger"
    assert time.monotonic() - began < 5
    assert calls == [[1]]


def test_settle_with_nothing_put_returns_at_once() -> None:
    drain: Drain[int] = Drain("test-drain", lambda items: None, linger=30.0)
    assert drain.settle(0)
