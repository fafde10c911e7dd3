"""A worker's main process freezes its heap right before each fork of a pool process, and beat
at its start (tasks/app.py): their full collections then skip the startup objects."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from celery.signals import beat_init, worker_before_create_process

from clarion.tasks.app import app


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()  # this test process's heap goes back under the collector


class _Node:
    me: _Node | None = None


@pytest.mark.parametrize("signal", [worker_before_create_process, beat_init])
def test_the_startup_heap_leaves_the_collectors_view(thawed, signal):
    assert gc.get_freeze_count() == 0
    kept = [[n] for n in range(10)]  # lists: containers the collector always tracks
    garbage = _Node()
    garbage.me = garbage  # a cycle only the collector frees
    gone = weakref.ref(garbage)
    del garbage
    signal.send(sender=app)
    assert gone() is None  # collected before the freeze, not frozen with the rest
    assert gc.get_freeze_count() > 1000  # every module, class and function imported so far
    looked_at = {id(o) for generation in range(3) for o in gc.get_objects(generation=generation)}
    assert all(gc.is_tracked(d) and id(d) not in looked_at for d in kept)
