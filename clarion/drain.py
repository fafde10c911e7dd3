"""A queue drained by `threads` threads per process: `put` returns at once; a free thread hands
everything waiting (up to `most`) to `handle` in one call, after waiting `linger` seconds from
the first item for more to arrive (fewer, larger calls where each call has a fixed cost). A caller
waiting in `settle` has nothing more to add, so the linger is cut short while it waits. Started on
first `put`, and again in a forked child (which inherits the queue's object but not the
threads)."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Drain(Generic[T]):
    def __init__(
        self,
        name: str,
        handle: Callable[[list[T]], None],
        *,
        most: int = 1000,
        threads: int = 1,
        linger: float = 0.0,
    ) -> None:
        self.name = name
        self.threads = threads
        self.handle = handle
        self.most = most
        self.linger = linger
        self._inbox: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._pending = 0  # put and not yet handled
        self._settled = threading.Condition()
        self._hurry = threading.Event()  # set while someone waits in settle(): no linger

    def put(self, item: T) -> None:
        if self._pid != os.getpid():
            self._start()
        with self._settled:
            self._pending += 1
        self._inbox.put(item)

    def waiting(self) -> int:
        """Items put and not yet handled."""
        return self._pending

    def settle(self, timeout: float) -> bool:
        """Wait until every item put so far was handled; False if `timeout` passed first."""
        with self._settled:
            if self._pending == 0:
                return True
            self._hurry.set()
            try:
                return self._settled.wait_for(lambda: self._pending == 0, timeout)
            finally:
                self._hurry.clear()

    def _start(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            self._inbox = queue.SimpleQueue()  # a forked child's copy holds no thread
            self._pending = 0
            self._settled = threading.Condition()
            self._hurry = threading.Event()
            for n in range(self.threads):
                name = f"{self.name}-{n}"
                threading.Thread(
                    target=self._serve, args=(self._inbox,), name=name, daemon=True
                ).start()
            self._pid = os.getpid()

    def _serve(self, inbox: queue.SimpleQueue[T]) -> None:
        while True:
            items = [inbox.get()]
            if self.linger:
                self._hurry.wait(self.linger)
            while len(items) < self.most:
                try:
                    items.append(inbox.get_nowait())
                except queue.Empty:
                    break
            try:
                self.handle(items)
            except Exception:  # the thread must outlive one bad batch; handle reports its own
                log.exception("%s: a batch failed", self.name, extra={"action": "drain_failed"})
            finally:
                with self._settled:
                    self._pending -= len(items)
                    self._settled.notify_all()
