"""Named fault-injection points, switched on by CLARION_FAULTS so crash windows are tested on purpose.

    CLARION_FAULTS="deliver.after_send=crash*3,route.before_commit=raise"

Each entry is `point=action[*times]`. Actions: `crash` (SIGKILL this process, like a machine dying),
`raise` (FaultInjected), `sleep:SECONDS` (hang, e.g. past a claim's lease). `*times` limits how often
the point fires across all processes; the count is kept with exclusive file creation in
CLARION_FAULTS_DIR (default <home>/faults). Without `*times` it fires every time.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from clarion import settings
from clarion.errors import ConfigurationError, FaultInjected

POINTS = frozenset(
    {
        "notify.before_publish",  # request row committed, route task not yet published
        "route.before_commit",  # deliveries planned, transaction not committed
        "route.after_commit",  # deliveries committed, deliver tasks not yet published
        "deliver.after_claim",  # claim held, nothing sent
        "deliver.after_send",  # provider accepted, "sent" not yet recorded
        "deliver.before_flush",  # a group of accepted sends about to be recorded (tasks.send.group)
        "click.before_commit",  # a button answer and what it stops applied, not committed
        "broadcast.before_commit",  # a broadcast's chunk of requests written, not committed
        "broadcast.after_chunk",  # a chunk committed (the cursor not yet past its step), not published
        "tick.before_commit",  # due series advanced and their occurrences written, not committed
        "events.after_post",  # an app's endpoint took an event, "delivered" not yet recorded
    }
)


@dataclass(frozen=True)
class Fault:
    point: str
    action: str
    argument: float = 0.0
    times: int | None = None


def parse(spec: str) -> dict[str, Fault]:
    """Parse a CLARION_FAULTS value; unknown points or actions are a ConfigurationError."""
    faults: dict[str, Fault] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        point, _, rest = entry.partition("=")
        action, _, times = rest.partition("*")
        action, _, argument = action.partition(":")
        if point not in POINTS:
            raise ConfigurationError(
                f"unknown fault point {point!r}; known: {', '.join(sorted(POINTS))}"
            )
        if action not in ("crash", "raise", "sleep"):
            raise ConfigurationError(f"unknown fault action {action!r} for {point}")
        try:
            count = int(times) if "*" in rest else None
            faults[point] = Fault(point, action, float(argument or 0), count)
        except ValueError as exc:
            raise ConfigurationError(f"malformed fault entry {entry!r}") from exc
        if count is not None and count < 1:
            raise ConfigurationError(f"fault entry {entry!r}: *times must be at least 1")
    return faults


@lru_cache(maxsize=1)
def _active() -> dict[str, Fault]:
    return parse(settings.get().faults)


def _take_turn(fault: Fault) -> bool:
    if fault.times is None:
        return True
    folder = settings.get().faults_dir or settings.get().home / "faults"
    Path(folder).mkdir(parents=True, exist_ok=True)
    for n in range(1, fault.times + 1):
        try:
            os.close(os.open(Path(folder) / f"{fault.point}.{n}", os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            continue
    return False


def hit(point: str) -> None:
    """Mark a fault point; does nothing unless the point is switched on."""
    fault = _active().get(point)
    if fault is None or not _take_turn(fault):
        return
    if fault.action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "raise":
        raise FaultInjected(point)
    else:
        time.sleep(fault.argument)


def reset() -> None:
    _active.cache_clear()
