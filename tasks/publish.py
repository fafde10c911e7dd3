"""Publishing wake-up messages. Messages carry keys only; the database holds the state."""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import kombu.exceptions

from clarion import settings
from clarion.tasks.app import app, use_broker

log = logging.getLogger(__name__)

ROUTE = "clarion.route"
DELIVER = "clarion.deliver"

# kombu ≥ 5.7: a publish batch whose flush failed (which of its messages went is unknown)
BATCH_FAILED = getattr(kombu.exceptions, "BatchPublishError", ())
# the messages of a failed batch, sent again one by one: a broker that restarts or fails over
# within a few seconds takes them
AGAIN = {
    "retry": True,
    "retry_policy": {
        "max_retries": 5,
        "interval_start": 0,
        "interval_step": 0.5,
        "interval_max": 1,
    },
}


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
    messages = [
        (lane, keys[start : start + size])
        for lane, keys in by_lane.items()
        for start in range(0, len(keys), size)
    ]
    options = {"retry": False} if fail_fast else {}
    with app.producer_or_acquire() as producer:
        if fail_fast:  # else kombu keeps reconnecting for broker_connection_timeout and more
            producer.connection.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0.1
            )
        try:
            with _batched(producer):
                _send(task, messages, producer, options)
        except BATCH_FAILED as exc:
            if fail_fast:
                raise
            # which of the batch reached the broker is unknown: all again, one by one, with a few
            # seconds of retries (AGAIN; a wake-up that arrives twice finds its rows taken)
            log.warning(
                "publish: a batch of %d %s messages failed (%s); sending them one by one",
                len(messages),
                task,
                exc.__cause__ or exc,
                extra={"action": "publish_batch_failed"},
            )
            _send(task, messages, producer, AGAIN)
    return len(messages)


def _send(
    task: str,
    messages: list[tuple[str, list[tuple[str, int]]]],
    producer: Any,
    options: dict[str, Any],
) -> None:
    declared: set[str] = set()
    for lane, chunk in messages:
        app.send_task(
            task,
            args=[[k[0] for k in chunk], [k[1] for k in chunk]],
            queue=lane,
            producer=producer,
            # what Flower and the logs show; Celery's own repr of 200 keys costs as much as the
            # rest of the publish
            argsrepr=_describe(chunk),
            kwargsrepr="{}",
            # the lane's queue declared by its first message of this publish only: kombu binds
            # (copies) the queue and its exchange before it looks at its cache of declared ones,
            # a quarter of each message's CPU (a broadcast chunk publishes 50 messages)
            **({"declare": []} if lane in declared else {}),
            **options,
        )
        declared.add(lane)


def _batched(producer: Any) -> contextlib.AbstractContextManager[object]:
    """The messages of one publish() sent together where the transport can (kombu ≥ 5.7's
    Producer.batch: on Redis, one pipeline instead of a round trip — and a new Redis client
    object — per message); one by one elsewhere (RabbitMQ)."""
    batch = getattr(producer, "batch", None)
    return batch() if batch is not None else contextlib.nullcontext()
