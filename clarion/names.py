"""Names that cross processes: the Celery queues workers consume and producers publish to."""

from __future__ import annotations

LANES = ("transactional", "activation")  # each lane has its own queue, workers and budgets
QUEUES = (*LANES, "control")  # control: ticks, receipts, clicks, retention — never behind a backlog
