"""The Celery app of bench/capacity.py's workers: clarion's own, plus the CPU seconds each task
takes, summed per task name in Redis (`HINCRBYFLOAT bench:capacity:cpu <task> <s>`, and a count in
`bench:capacity:n`), so the bench can split a worker's CPU into route, deliver and the rest.

    python -m celery -A bench.capacity_probe worker ...   (from the repository root)

A prefork pool child runs one task at a time, so the process's CPU time between a task's prerun
and postrun is that task's (its send threads included)."""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun

from clarion.celery import app

CPU, COUNT = "bench:capacity:cpu", "bench:capacity:n"
_began: dict[str, float] = {}
_client: list[redis.Redis] = []  # made in the pool child, after the fork


@task_prerun.connect
def _start(task_id: str | None = None, **_: Any) -> None:
    if task_id:
        _began[task_id] = time.process_time()


@task_postrun.connect
def _stop(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    began = _began.pop(task_id or "", None)
    if began is None or task is None:
        return
    used = time.process_time() - began
    if not _client:
        _client.append(redis.Redis.from_url(os.environ["CLARION_REDIS_URL"]))
    pipe = _client[0].pipeline()
    pipe.hincrbyfloat(CPU, task.name, used)
    pipe.hincrby(COUNT, task.name, 1)
    pipe.execute()


__all__ = ["app"]
