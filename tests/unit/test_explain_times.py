"""`clarion explain`'s relative times: the largest unit and the next one, future and past."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clarion.ops.explain import relative

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "now"),
        (0.4, "now"),
        (1, "in 1s"),
        (59, "in 59s"),
        (60, "in 1m 0s"),
        (250, "in 4m 10s"),
        (3600 + 2, "in 1h 0m"),
        (3 * 3600 + 25 * 60 + 9, "in 3h 25m"),
        (86400 * 2 + 3600 * 5 + 7, "in 2d 5h"),
        (-7, "7s ago"),
        (-(2 * 3600 + 5 * 60), "2h 5m ago"),
    ],
)
def test_relative_times(seconds: float, shown: str) -> None:
    assert relative(NOW + timedelta(seconds=seconds), NOW) == shown
