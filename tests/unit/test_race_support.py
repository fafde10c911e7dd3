"""tests.support.race.Raced.most_at_once: what a race test asserts to prove its contenders met."""

from __future__ import annotations

import pytest

from tests.support.race import Raced


def raced(*spans: tuple[float, float]) -> Raced:
    result = Raced([None] * len(spans))
    result.spans = list(spans)
    return result


@pytest.mark.parametrize(
    ("spans", "most"),
    [
        (((0, 1), (2, 3)), 1),  # one after the other: they never met
        (((0, 1), (1, 2)), 1),  # touching is not meeting
        (((0, 2), (1, 3)), 2),
        (((0, 10), (1, 2), (3, 4), (5, 6)), 2),
        (((0, 5), (1, 6), (2, 7), (8, 9)), 3),
    ],
)
def test_most_at_once_counts_contenders_inside_at_one_instant(spans, most):
    assert raced(*spans).most_at_once() == most
