"""tasks/lanes.py's feedback rule on an injected clock: a bulk process's slices shrink while
transactional work is in flight, it waits for that work (up to its patience), and its rate comes
back once transactional work is idle."""

from __future__ import annotations

import pytest

from clarion.tasks.app import bulk_niceness
from clarion.tasks.lanes import Budget, Feedback, Pacer

RULE = Feedback(floor=20.0, ceiling=10_000.0, cut=0.5, gain=4_000.0, react=0.05, slice=0.02)


class World:
    """A clock that moves only when the pacer sleeps, and transactional work in flight until
    a given moment."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy_until = -1.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def active(self) -> int:
        return int(self.now < self.busy_until)

    def pacer(self) -> Pacer:
        return Pacer(RULE, active=self.active, clock=self.clock, sleep=self.sleep)


def test_an_idle_lane_goes_at_its_ceiling_in_full_slices():
    world = World()
    pacer = world.pacer()
    sizes = [pacer.next_slice() for _ in range(5)]
    assert sizes == [200] * 5  # 0.02 s of 10,000/s
    assert pacer.budget.rate == RULE.ceiling


def test_transactional_work_cuts_the_slices_and_is_waited_for():
    world = World()
    pacer = world.pacer()
    world.busy_until = 0.03  # a receipt in flight for 30 ms
    size = pacer.next_slice()
    assert world.now >= 0.03, "the slice did not wait for the receipt"
    assert pacer.budget.rate == RULE.ceiling * RULE.cut
    assert size == 100
    # receipt after receipt: each halves the rate once, down to the floor
    sizes = []
    for _ in range(12):
        world.busy_until = world.now + 0.01
        sizes.append(pacer.next_slice())
        world.now += RULE.react
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < 10
    assert pacer.budget.rate < 100


def test_a_receipt_is_one_cut_however_many_slices_see_it():
    budget = Budget(rate=1000.0, tokens=0.0, at=0.0)
    budget.observe(True, 0.0, RULE)
    budget.observe(True, 0.01, RULE)
    budget.observe(True, 0.02, RULE)
    assert budget.rate == 500.0
    budget.observe(True, 0.06, RULE)
    assert budget.rate == 250.0


def test_the_rate_recovers_linearly_while_transactional_is_idle():
    world = World()
    pacer = world.pacer()
    pacer.budget.rate = RULE.floor
    world.now += 0.5
    pacer.next_slice()
    assert pacer.budget.rate == pytest.approx(RULE.floor + 0.5 * RULE.gain)
    world.now += 10
    pacer.next_slice()
    assert pacer.budget.rate == RULE.ceiling


def test_a_slow_rate_spaces_its_slices_out():
    world = World()
    pacer = world.pacer()
    pacer.budget = Budget(rate=RULE.floor, tokens=0.0, at=0.0)
    pacer.rule = Feedback(floor=20.0, ceiling=20.0, slice=0.02)  # pinned at the floor
    sent = sum(pacer.next_slice() for _ in range(40))
    assert sent == 40
    assert world.now == pytest.approx(40 / RULE.floor, rel=0.05)


def test_transactional_work_that_never_ends_is_waited_for_only_up_to_the_patience():
    world = World()
    pacer = world.pacer()
    world.busy_until = 1e9
    assert pacer.next_slice() >= 1
    assert RULE.patience <= world.now < RULE.patience + 2 * RULE.poll
    for _ in range(50):
        pacer.next_slice()
    assert pacer.budget.rate == RULE.floor  # it still goes, at the floor


@pytest.mark.parametrize(
    ("queues", "nice", "expected"),
    [
        (["activation"], 10, 10),
        ("activation", 7, 7),
        (["activation", "transactional"], 10, 0),
        ("transactional,control", 10, 0),
        (None, 10, 0),
        (["activation"], 0, 0),
    ],
)
def test_only_a_worker_of_bulk_lanes_alone_is_niced(queues, nice, expected):
    assert bulk_niceness(queues, nice) == expected
