"""Names that cross processes: the Celery queues workers consume and producers publish to."""

from __future__ import annotations

LANES = ("transactional", "activation")  # each lane has its own queue, workers and budgets
# control: ticks, receipts, clicks, retention — never behind a backlog; events: outbound events to
# apps' endpoints (tasks/events.py), so a slow endpoint holds only its own lane
QUEUES = (*LANES, "control", "events")
