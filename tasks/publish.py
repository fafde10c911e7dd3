"""Publishing wake-up messages. Messages carry keys only; the database holds the state."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from clarion import settings
from clarion.tasks.app import app, use_broker

ROUTE = "clarion.route"
DELIVER = "clarion.deliver"


def _describe(chunk: list[tuple[str, int]]) -> str:
    """A batch as Flower lists it: its size and first key."""
    user, id_ = chunk[0]
    more = f" and {len(chunk) - 1} more" if len(chunk) > 1 else ""
    return f"[{user!r} #{id_}{more}]"[:200]


def publish(task: str, rows: Iterable[tuple[str, int, str]], *, fail_fast: bool = False) -> int:
    """Publish `task` for (user_id, id, lane) rows, in batches per lane; returns messages sent.

    `fail_fast`: one connection attempt and no publish retries, for callers whose rows are already
    committed and will be republished by the beat tick anyway (notify): a broker that is down
    raises within about a connection timeout instead of blocking the caller."""
    by_lane: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for user_id, id_, lane in rows:
        by_lane[lane].append((user_id, id_))
    if not by_lane:
        return 0
    use_broker(settings.get().urls()[2])
    size = settings.get().batch_size
    sent = 0
    options = {"retry": False} if fail_fast else {}
    with app.producer_or_acquire() as producer, _batched(producer):
        if fail_fast:  # else kombu keeps reconnecting for broker_connection_timeout and more
            producer.connection.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0.1
            )
        for lane, keys in by_lane.items():
            for start in range(0, len(keys), size):
                chunk = keys[start : start + size]
                app.send_task(
                    task,
                    args=[[k[0] for k in chunk], [k[1] for k in chunk]],
                    queue=lane,
                    producer=producer,
                    # what Flower and the logs show; Celery's own repr of 200 keys costs as much
                    # as the rest of the publish
                    argsrepr=_describe(chunk),
                    kwargsrepr="{}",
                    **options,
                )
                sent += 1
    return sent


def _batched(producer: Any) -> contextlib.AbstractContextManager[object]:
    """The messages of one publish() sent together where the transport can (kombu ≥ 5.7's
    Producer.batch: on Redis, one pipeline instead of a round trip — and a new Redis client
    object — per message); one by one elsewhere. A batch that fails raises a KombuError, as a
    publish does: the rows are committed, and the beat tick publishes them again at their due_at."""
    batch = getattr(producer, "batch", None)
    return batch() if batch is not None else contextlib.nullcontext()
