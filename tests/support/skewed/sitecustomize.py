"""Loaded (through PYTHONPATH) by the Python processes the multi-host rig starts on a skewable
clock (tests/support/hosts.py, `clock=True`), and by nothing else.

libfaketime 0.9.10 (Debian 12) skews the wall clock these processes read. Its faked monotonic
clock cannot be used: now and then it reads on the wall clock's scale, and a timed wait computed
from it (every `threading` wait with a timeout, `queue.get(timeout=…)`, a lock's acquire) then
sleeps for decades — a worker host of the all-faults soak run went silent for good that way, its
futex deadline at 1.79e9 s on the monotonic clock. So the rig sets FAKETIME_DONT_FAKE_MONOTONIC,
which is also what a skewed host is (NTP steps the wall clock, never the monotonic one); but with
it libfaketime answers EINVAL to clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which is how
`time.sleep` sleeps. Here `time.sleep` waits on a lock instead (sem_clockwait on the real
monotonic clock, which libfaketime leaves alone); it wakes for signals as `time.sleep` does.
"""

from __future__ import annotations

import os
import threading
import time

_never = threading.Lock()
_never.acquire()


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    if seconds == 0:
        os.sched_yield()
        return
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        _never.acquire(timeout=min(left, threading.TIMEOUT_MAX))


time.sleep = _sleep  # type: ignore[assignment]
