"""A separate, tiny Celery app with one no-op task: the raw-Celery baseline of bench/throughput.py.

It uses clarion's broker and the same reliability settings as `celeryconfig` (JSON, acks_late,
reject_on_worker_lost, prefetch 1, visibility timeout), so the only difference from clarion's
workers is the work each message does. Each task does one Redis INCR so the benchmark can count
completions:

    python -m celery -A bench.noop worker -Q bench_noop ...
"""

from __future__ import annotations

import os

import redis as redis_lib
from celery import Celery

from clarion import celeryconfig, settings

QUEUE = "bench_noop"

app = Celery("bench_noop")
app.conf.update(
    broker_url=celeryconfig.broker_url,
    task_default_queue=QUEUE,
    **{
        name: getattr(celeryconfig, name)
        for name in (
            "task_serializer",
            "accept_content",
            "task_ignore_result",
            "broker_connection_retry_on_startup",
            "task_acks_late",
            "task_reject_on_worker_lost",
            "worker_prefetch_multiplier",
            "worker_cancel_long_running_tasks_on_connection_loss",
            "broker_transport_options",
        )
    },
)

# bench/idle.py's baseline runs `celery -A bench.noop beat`: a one-second clock, like clarion's tick
app.conf.beat_schedule = {
    "noop-every-second": {"task": "bench.noop", "schedule": 1.0, "args": ("bench:idle",)}
}

_clients: dict[int, redis_lib.Redis] = {}


def _redis() -> redis_lib.Redis:
    pid = os.getpid()
    if pid not in _clients:
        _clients.clear()
        _clients[pid] = redis_lib.Redis.from_url(settings.get().urls()[1])
    return _clients[pid]


@app.task(name="bench.noop")
def noop(counter: str) -> None:
    _redis().incr(counter)
