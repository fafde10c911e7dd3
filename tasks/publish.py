"""Publishing wake-up messages. Messages carry keys only; the database holds the state."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from clarion import settings
from tasks.app import app, use_broker

ROUTE = "clarion.route"
DELIVER = "clarion.deliver"


def publish(task: str, rows: Iterable[tuple[str, int, str]]) -> int:
    """Publish `task` for (user_id, id, lane) rows, in batches per lane; returns messages sent."""
    by_lane: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for user_id, id_, lane in rows:
        by_lane[lane].append((user_id, id_))
    if not by_lane:
        return 0
    use_broker(settings.get().urls()[2])
    size = settings.get().batch_size
    sent = 0
    with app.producer_or_acquire() as producer:
        for lane, keys in by_lane.items():
            for start in range(0, len(keys), size):
                chunk = keys[start : start + size]
                app.send_task(task, args=[[k[0] for k in chunk], [k[1] for k in chunk]],
                              queue=lane, producer=producer)
                sent += 1
    return sent
