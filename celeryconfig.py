"""Celery configuration for clarion: broker, lanes, beat schedule and reliability settings.

Loaded by `tasks.app` from this file's path (never by module name: a host app's own celeryconfig
on sys.path must not replace it); a worker refuses to start without CLARION_CONFIG. Queues: one per lane
(`transactional`, `activation`) plus `control` for beat work, so a backlog in one lane never
delays another; run separate workers per lane (`clarion worker --lane …`).
"""

from datetime import timedelta

from kombu import Queue

from clarion import sentinel, settings
from clarion.errors import ConfigurationError, ServicesUnavailable

CLARION_CONFIG = True  # the marker tasks.app checks at worker start: this is clarion's config

try:
    _settings = settings.get()
except ConfigurationError:
    # A bad setting must not make importing fail with a traceback: a worker refuses to start with
    # the reason in one line (tasks.app reads the settings again), and so does every command.
    _settings = settings.Settings()
broker_url: str | None
try:
    broker_url = _settings.urls()[2]
except ServicesUnavailable:
    # Importing must not need running services (tests are collected before any start). A process
    # that publishes resolves the broker then (tasks.publish); a worker refuses to start without it.
    broker_url = None

task_queues = [Queue("transactional"), Queue("activation"), Queue("control"), Queue("events")]
task_default_queue = "control"
task_routes = {
    "clarion.tick": {"queue": "control"},
    "clarion.alerts": {"queue": "control"},
    "clarion.refresh_collapsed": {"queue": "control"},
    "clarion.retention": {"queue": "control"},
    "clarion.events": {"queue": "events"},
}  # route/deliver name their lane when published

task_serializer = "json"
accept_content = ["json"]
task_ignore_result = True  # state lives in PostgreSQL; no result backend
broker_connection_retry_on_startup = True

# Ack a message only after its task ran: a worker that dies mid-task leaves it to be redelivered.
task_acks_late = True
# Without this, Celery acks the message of a child process that was killed (OOM, SIGKILL) anyway.
task_reject_on_worker_lost = True
# One message in flight per process: a killed process loses (and delays) at most one batch, and a
# busy process does not hoard work that idle ones could do.
worker_prefetch_multiplier = 1
# A broker restart must not cancel a task mid-send (Celery would SIGTERM it between the provider's
# answer and "sent" — a crash window per message in flight). Running tasks finish; a message whose
# ack is lost with the connection is redelivered, and the ledger makes that a no-op.
worker_cancel_long_running_tasks_on_connection_loss = False
# Redis returns an unacked message only after this; the sweeper republishes from the database
# anyway, so this is a backstop, not what recovery waits on. Nothing uses long ETAs (kombu #337).
# A sentinel:// broker (clarion/sentinel.py): the master's name and timeouts that notice a master
# whose host vanished, so workers and publishers follow the failover.
broker_transport_options = {
    "visibility_timeout": _settings.visibility_timeout,
    **sentinel.transport_options(
        _settings.broker_url or _settings.redis_url, _settings.sentinel_master
    ),
}

# Task events only while someone watches: Flower (`clarion flower`) asks every worker for them
# when it starts and every 5 s after (the `enable_events` control command; `celery control
# enable_events` does the same by hand). Sent by default they cost the worker's main process three
# Redis publishes per task, each through a new redis-py client inside kombu: ~2.5 ms of CPU per
# receipt on a 2-core host, about an eighth of the transactional worker's (bench/RESULTS.md,
# "Lanes under a campaign"). Worker heartbeats go out either way, so Flower lists the workers.
worker_send_task_events = False
# No "task-sent" events: beat's once-a-second tick would be one each (a task's own send_events
# flag does not stop them); Flower shows tasks from "received" on.
task_send_sent_event = False

beat_schedule = {
    "tick": {
        "task": "clarion.tick",
        "schedule": timedelta(seconds=_settings.tick_interval),
        "options": {"queue": "control", "expires": max(1.0, _settings.tick_interval * 5)},
    },
    # Alerts (tasks/alerts.py): their own entry, not inside the tick, so the tick's second stays
    # for publishing work; an evaluation missed (expired) is simply the next one's.
    "alerts": {
        "task": "clarion.alerts",
        "schedule": timedelta(seconds=_settings.alert_interval),
        "options": {"queue": "control", "expires": _settings.alert_interval},
    },
    # Outbound events to apps' endpoints (tasks/events.py): their own queue, so a slow endpoint
    # never holds a lane that sends; a round missed (expired) is the next one's.
    "events": {
        "task": "clarion.events",
        "schedule": timedelta(seconds=_settings.tick_interval),
        "options": {"queue": "events", "expires": max(1.0, _settings.tick_interval * 5)},
    },
    # Retention (tasks/retention.py): hourly, in bounded batches; a run missed is the next one's.
    "retention": {
        "task": "clarion.retention",
        "schedule": timedelta(hours=1),
        "options": {"queue": "control", "expires": 3600},
    },
}
beat_schedule_filename = str(_settings.home / "celerybeat-schedule")
# Beat sends the every-second tick only when something is due (tasks/beat.py: one read first), and
# sleeps until an entry is due instead of polling the last 10 ms.
beat_scheduler = "clarion.tasks.beat:Scheduler"
