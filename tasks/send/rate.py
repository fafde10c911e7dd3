"""Send outcomes per channel per minute, cluster-wide in Redis: what the rate-drop alert reads.

A deliver task tallies its provider calls in process memory (`note`) and writes them once at its
end (`flush`: one pipelined round trip per task, not one Redis call per row). Each minute is one
hash, `clarion:sendrate:<minute since the epoch>`, with fields `<channel>:ok` and `<channel>:bad`;
it expires once no window can reach it. A lost flush (Redis down) loses counts, never a send.

Why Redis and not a query: failed and retried rows have no indexed time column per channel, and
the evaluation must cost the same at a thousand sends a minute as at ten (one HGETALL per minute
of the window).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from datetime import datetime

import redis as redis_lib

from clarion import clock, settings
from clarion.tasks import runtime

KEY = "clarion:sendrate:{minute}"
GOOD = frozenset({"sent"})
BAD = frozenset({"failed", "unknown"})  # a refused send (4xx/5xx), or one whose outcome is lost

_lock = threading.Lock()
_tally: Counter[str] = Counter()


def note(channel: str, outcome: str, calls: int = 1) -> None:
    """Count `calls` provider calls' outcome (sent | failed | unknown); others are not counted."""
    kind = "ok" if outcome in GOOD else "bad" if outcome in BAD else None
    if kind is not None:
        with _lock:
            _tally[f"{channel}:{kind}"] += calls


def _minute(at: datetime) -> int:
    return int(at.timestamp()) // 60


def flush(now: datetime | None = None) -> None:
    """Write what this process counted since the last flush into the current minute's bucket."""
    with _lock:
        taken = dict(_tally)
        _tally.clear()
    if not taken:
        return
    key = KEY.format(minute=_minute(now or clock.now()))
    keep = int(settings.get().alert_window) + 180
    with contextlib.suppress(redis_lib.RedisError):
        pipe = runtime.redis().pipeline(transaction=False)
        for field, n in taken.items():
            pipe.hincrby(key, field, n)
        pipe.expire(key, keep)
        pipe.execute()


def window(now: datetime, seconds: float) -> dict[str, tuple[int, int]]:
    """channel -> (ok, bad) over the whole minutes ending with the current one."""
    last = _minute(now)
    minutes = range(last - max(1, round(seconds / 60)) + 1, last + 1)
    pipe = runtime.redis().pipeline(transaction=False)
    for minute in minutes:
        pipe.hgetall(KEY.format(minute=minute))
    totals: Counter[str] = Counter()
    for bucket in pipe.execute():
        for field, n in bucket.items():
            totals[field.decode()] += int(n)
    channels = {f.rpartition(":")[0] for f in totals}
    return {c: (totals[f"{c}:ok"], totals[f"{c}:bad"]) for c in sorted(channels)}
