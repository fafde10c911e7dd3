"""`clarion ping`: is a worker consuming each lane, answering now? (A worker's readiness probe.)

Celery's remote control asks every worker on the broker which queues it consumes
(`inspect().active_queues()`, one broadcast, replies collected for `timeout` seconds); a lane is
served when at least one worker that answered consumes its queue. The broker is reached first
with one short attempt, so a broker that is down is a one-line reason, not a hang.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clarion import settings
from clarion.errors import ClarionError


def served(replies: Mapping[str, Sequence[Mapping[str, Any]]] | None) -> dict[str, list[str]]:
    """{queue: [workers consuming it]} from active_queues()'s replies."""
    found: dict[str, list[str]] = {}
    for worker, queues in (replies or {}).items():
        for queue in queues or ():
            found.setdefault(str(queue.get("name")), []).append(worker)
    return found


def verdict(lanes: Sequence[str], by_queue: Mapping[str, Sequence[str]]) -> tuple[bool, str]:
    """(every lane served, one line saying so or naming the lanes nobody answered for)."""
    missing = [lane for lane in lanes if not by_queue.get(lane)]
    if missing:
        answered = sorted({w for workers in by_queue.values() for w in workers})
        return False, (
            f"no worker answered for lane(s) {', '.join(missing)} "
            f"(answered: {', '.join(answered) or 'none'})"
        )
    return True, "ok: " + ", ".join(
        f"{lane} ({', '.join(sorted(by_queue[lane]))})" for lane in lanes
    )


def ping(lanes: Sequence[str], *, timeout: float) -> tuple[bool, str]:
    """(ok, line): ask the workers on the configured broker for `timeout` seconds."""
    from clarion.tasks.app import app, check_broker, use_broker

    try:
        url = settings.get().urls()[2]
        use_broker(url)
        check_broker(url)
    except ClarionError as exc:
        return False, str(exc).splitlines()[0]
    replies = app.control.inspect(timeout=timeout).active_queues()
    return verdict(lanes, served(replies))
