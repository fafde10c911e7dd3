"""A starting worker's wait for its broker and database (tasks/startup.py): delays double up to a
cap, one line per attempt at most, and past the wait it gives up with DependencyMissing (exit 75),
never a ConfigurationError (a refusal). Time is injected: nothing here sleeps."""

from __future__ import annotations

import pytest

from clarion.errors import ConfigurationError, DependencyMissing
from clarion.tasks.startup import Waiting, database_probe, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _down_until(clock: Clock, at: float, why: str = "refused"):
    return lambda: None if clock.now >= at else why


def test_it_waits_with_doubling_capped_delays_until_both_answer():
    clock, said = Clock(), []
    attempts = wait_for(
        {"broker": _down_until(clock, 20), "database": _down_until(clock, 5)},
        within=60,
        waiting=Waiting(first=0.5, most=4),
        sleep=clock.sleep,
        monotonic=lambda: clock.now,
        say=said.append,
    )
    assert clock.slept == [0.5, 1, 2, 4, 4, 4, 4, 4]  # capped at 4
    assert attempts == 9
    assert len(said) == 9  # one line per failed attempt, one "ready"
    assert said[0] == (
        "clarion: worker not ready (attempt 1): broker: refused; database: refused; "
        "next attempt in 0.5 s"
    )
    assert said[4] == "clarion: worker not ready (attempt 5): broker: refused; next attempt in 4 s"
    assert said[-1] == "clarion: worker ready after 9 attempts"


def test_past_the_wait_it_gives_up_naming_what_is_missing_not_as_a_refusal():
    clock, said = Clock(), []
    with pytest.raises(DependencyMissing, match=r"^database: connection refused$") as raised:
        wait_for(
            {"broker": lambda: None, "database": lambda: "connection refused"},
            within=10,
            waiting=Waiting(first=1, most=8),
            sleep=clock.sleep,
            monotonic=lambda: clock.now,
            say=said.append,
        )
    assert not isinstance(raised.value, ConfigurationError)
    assert raised.value.missing == {"database": "connection refused"}
    assert clock.slept == [1, 2, 4]  # 7 s; the next 8 s pause would pass the 10 s wait
    assert len(said) == 3


def test_no_wait_at_all_tries_once():
    clock = Clock()
    with pytest.raises(DependencyMissing, match="broker: down"):
        wait_for({"broker": lambda: "down"}, within=0, sleep=clock.sleep, say=lambda _: None)
    assert clock.slept == []


def test_a_database_that_is_not_listening_is_reported_not_raised():
    why = database_probe("postgresql://clarion@127.0.0.1:1/clarion")()
    assert why is not None and why.startswith("OperationalError: "), why
