"""The Celery app. Workers run `celery -A clarion worker`; `clarion worker` does that for you.

clarion's Celery settings are `clarion.celeryconfig` (the repository's top-level `celeryconfig.py`),
loaded by its package name, so a host app's own `celeryconfig` module can neither replace nor
shadow it.

A worker refuses to start — one line on stderr, exit status 2, within seconds — unless the loaded
config is clarion's, the catalog loads, the database is migrated and its recorded tz database
release is this install's (scheduling/zones.py). A broker or database that does not answer yet is
not a refusal: the worker waits for them with backoff (tasks/startup.py, CLARION_START_WAIT) and
then exits 75 (UNAVAILABLE) so that its supervisor starts it again. Celery logs and swallows
exceptions raised by signal handlers (celery #2738), so both leave the process with os._exit.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import signal
import sys

import kombu.pools
from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    beat_init,
    celeryd_init,
    task_prerun,
    worker_before_create_process,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
)
from kombu.utils.url import maybe_sanitize_url

from clarion import logs, metrics, sentinel, settings
from clarion.errors import ClarionError, ConfigurationError, DependencyMissing
from clarion.names import QUEUES
from clarion.tasks import startup

CONFIG_MODULE = "clarion.celeryconfig"
LANE_QUEUES = frozenset(QUEUES)
BROKER_CHECK_TIMEOUT = 3.0  # seconds to reach the broker at start before refusing
REFUSED = 2  # exit status of a worker that refuses to start


app = Celery(
    "clarion",
    include=[
        "clarion.tasks.route",
        "clarion.tasks.deliver",
        "clarion.tasks.tick",
        "clarion.tasks.alerts",
        "clarion.tasks.refresh",
        "clarion.tasks.retention",
        "clarion.tasks.events",
        "clarion.tasks.broadcasts",
    ],
)
app.config_from_object(CONFIG_MODULE)
# The beat's own work (the tick every second, alerts, refreshes, retention, the events round):
# no INFO line per run.
logs.quiet_control_tasks(
    {
        name
        for name, route in app.conf.task_routes.items()
        if route.get("queue") in ("control", "events")
    }
)


def log_format() -> str:
    """CLARION_LOG_FORMAT, or text while the settings are broken (the start check says why)."""
    try:
        return settings.get().log_format
    except ClarionError:
        return "text"


@after_setup_logger.connect
@after_setup_task_logger.connect
def _log_format(logger: object = None, **_: object) -> None:
    if isinstance(logger, logging.Logger):
        logs.reformat(logger, log_format())


@celeryd_init.connect
def _json_from_the_start(instance: object = None, **_: object) -> None:
    """With CLARION_LOG_FORMAT=json, what a worker writes before Celery sets up its logging is
    JSON too: warnings (the superuser warning comes next) go through a JSON handler, and the
    plain-text start banner is not printed."""
    if log_format() != "json":
        return
    logs.configure("json")
    logging.captureWarnings(True)
    import celery.apps.worker

    celery.apps.worker.safe_say = logs.say_json  # "worker: Warm shutdown", printed past logging
    if instance is not None:
        instance.quiet = True  # type: ignore[attr-defined]


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A forked child must not share its parent's database or HTTP connections.
    from clarion.db import engine

    engine.dispose_all()


@worker_process_init.connect
def _watch_the_catalog(**_: object) -> None:
    """A pool process looks at the catalog file every second, idle or not (tasks/catalogs.py)."""
    from clarion.tasks import runtime

    runtime.watch_catalog()


@worker_ready.connect
def _watch_the_catalog_here(sender: object = None, **_: object) -> None:
    """A solo or threads worker runs its tasks in its main process, which then looks too. A
    prefork main process runs none and keeps no thread of ours: it forks, and a fork beside a
    running thread can copy a lock that thread held."""
    from celery.concurrency.prefork import TaskPool

    from clarion.tasks import runtime

    if not isinstance(getattr(sender, "pool", None), TaskPool):
        runtime.watch_catalog()


@worker_process_init.connect
def _stacks_on_request(**_: object) -> None:
    """`kill -USR2 <pool process>` prints every thread's stack to the worker's stderr: what a
    stuck pool process is waiting on, without a debugger (SIGUSR1 is billiard's soft time limit
    in a pool process, and Celery's own stack dump in the main process)."""
    faulthandler.register(signal.SIGUSR2, file=sys.__stderr__ or sys.stderr, all_threads=True)


@worker_process_shutdown.connect
def _metrics_of_a_finished_child(pid: int | None = None, **_: object) -> None:
    metrics.process_exited(pid or os.getpid())


@task_prerun.connect
def _look_at_the_catalog(**_: object) -> None:
    """Every task, ticks included, looks at the catalog file (at most once a second: one stat),
    so an edit reaches every pool process within about a second (tasks/catalogs.py)."""
    from clarion.tasks import runtime

    with contextlib.suppress(ClarionError):  # never loaded: the task that needs it says so
        runtime.catalog()


@worker_before_create_process.connect
@beat_init.connect
def _freeze_the_heap(**_: object) -> None:
    """Everything built so far (Celery, SQLAlchemy, the catalog: ~130k objects) leaves the
    garbage collector's view (gc.freeze), as the gc docs advise right before a fork: a worker's
    main process and beat otherwise walk it on every full collection, ~100 ms each on a loaded
    2-core host, a few times a minute under load; and a forked pool process's collections no
    longer write into the pages it shares with its parent. Startup objects live as long as the
    process anyway (web/server.py freezes its own). Collected first, so no garbage is frozen with
    them: ~100 ms the first time, little after (a pool process replaced later forks again)."""
    gc.collect()
    gc.freeze()


@beat_init.connect
def _name_the_catalog(**_: object) -> None:
    """Beat renders nothing, but says which catalog the deployment runs (tasks/catalogs.py)."""
    from clarion.tasks import runtime

    try:
        runtime.catalog()
    except ClarionError as exc:
        print(f"clarion: beat: the catalog does not load: {exc}", file=sys.stderr, flush=True)


@celeryd_init.connect
def _refuse_a_wrong_start(**_: object) -> None:
    """Runs in the `celery worker` main process before it builds its pool or consumes anything."""
    try:
        check_worker_start()
    except DependencyMissing as exc:
        print(f"clarion: worker not ready, giving up for now: {exc}", file=sys.stderr, flush=True)
        os._exit(startup.UNAVAILABLE)
    except ClarionError as exc:
        refuse(str(exc))
    except Exception as exc:  # anything unexpected here is as fatal: never start half-configured
        refuse(f"{type(exc).__name__}: {exc}")


@celeryd_init.connect
def _bulk_workers_give_way(options: dict[str, object] | None = None, **_: object) -> None:
    """A worker that consumes only bulk lanes (activation) lowers its CPU priority before its
    pool forks (CLARION_BULK_NICE, default 10): on a host every lane shares, a receipt's worker
    then gets the CPU before a slice of nudges or broadcast mail (tasks/lanes.py). Its session
    too, where Linux schedules sessions as groups and the worker leads its own
    (tasks.lanes.nice_session). Its PostgreSQL backends too, where the server is on this host and
    permits it (CLARION_BULK_NICE_DATABASE, tasks.lanes.nice_backends)."""
    step = bulk_niceness((options or {}).get("queues"), settings.get().bulk_nice)
    if not step:
        return
    from clarion.tasks.lanes import nice_backends, nice_session

    os.nice(step)
    why = nice_session(step)  # and its session's, where Linux schedules sessions as groups
    if why:
        logging.getLogger(__name__).info(
            "bulk worker's session not niced: %s",
            why,
            extra={"action": "bulk_session_not_niced", "reason": why},
        )
    if settings.get().bulk_nice_database == "on":
        nice_backends(step)  # and its PostgreSQL backends, where permitted (tasks/lanes.py)


def bulk_niceness(queues: object, nice: int) -> int:
    """The niceness increment for a worker of `queues` (-Q: a list or comma-separated text)."""
    from clarion.tasks.lanes import BULK

    listed = queues.split(",") if isinstance(queues, str) else list(queues or [])  # type: ignore[call-overload]
    names = {str(q).strip() for q in listed} - {""}
    return nice if names and names <= BULK else 0


@beat_init.connect
def _refuse_a_wrong_beat(**_: object) -> None:
    """Beat sends and counts nothing itself, but it runs the same start check of the metrics as a
    worker: a process that would count privately is refused, never silently left to run."""
    try:
        metrics.check()
    except ClarionError as exc:
        refuse(str(exc), what="beat")


def refuse(message: str, what: str = "worker") -> None:
    """Stop this process now: Celery logs and carries on after any exception a signal handler
    raises, so say why on stderr and leave without unwinding (no pool or consumer exists yet)."""
    print(f"clarion: {what} refused to start: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(REFUSED)


def check_worker_start() -> None:
    """Raise ConfigurationError unless this worker has clarion's config, a catalog and a migrated
    database; wait for the broker and the database first (DependencyMissing if they stay away)."""
    check_config(app.conf)
    metrics.check()  # clarion's counters land in the folder /metrics reads, whoever came first
    database_url, _, broker_url = settings.get().urls()  # ServicesUnavailable: nothing configured
    use_broker(broker_url)
    from clarion.tasks import runtime

    runtime.check_catalog()  # every template renders for every channel, or the worker refuses
    startup.wait_for(
        {
            "broker": startup.broker_probe(lambda: check_broker(app.conf.broker_url)),
            "database": startup.database_probe(database_url),
        },
        within=settings.get().start_wait,
    )
    check_tz_database()


def check_tz_database() -> None:
    """This worker computes with the tz release recorded in the database (tasks.series): two
    releases would give two due times for one series. Its engine() refuses a database that was
    never migrated (db.engine.check_schema), so that is refused here, once, and not by every tick.
    A database that cannot be reached now is not a refusal (the tick checks again before each
    batch, and refuses to fire)."""
    from sqlalchemy.exc import DBAPIError

    from clarion.db.engine import engine
    from clarion.tasks.series import tz_database_problem

    try:
        with engine().connect() as conn:
            problem = tz_database_problem(conn)
    except DBAPIError:
        return
    if problem:
        raise ConfigurationError(problem)


def check_config(conf: object) -> None:
    """The loaded Celery config is clarion's: its marker, the lane queues and late acks."""
    get = getattr(conf, "get", None)
    if get is None or get("CLARION_CONFIG") is not True:
        raise ConfigurationError(
            "the Celery config is not clarion's celeryconfig.py (no CLARION_CONFIG "
            "marker): a module of that name elsewhere on sys.path, or config_from_object"
        )
    queues = {getattr(q, "name", q) for q in get("task_queues") or ()}
    if queues != LANE_QUEUES:
        raise ConfigurationError(
            f"the Celery config's task_queues are {sorted(queues)}, not clarion's "
            f"lanes {sorted(LANE_QUEUES)}"
        )
    if not (get("task_acks_late") and get("task_reject_on_worker_lost")):
        raise ConfigurationError(
            "the Celery config lost late acks (task_acks_late, "
            "task_reject_on_worker_lost): messages would be lost with a worker"
        )


def check_broker(url: str | None) -> None:
    """One short connection attempt; no default broker (Celery's is amqp://guest@localhost)."""
    if not url:
        raise ConfigurationError(
            "no broker configured: set CLARION_BROKER_URL or CLARION_REDIS_URL"
        )
    try:
        with app.connection_for_write(url) as conn:
            conn.ensure_connection(max_retries=1, timeout=BROKER_CHECK_TIMEOUT)
    except Exception as exc:
        safe = maybe_sanitize_url(url)  # without the password
        raise ConfigurationError(f"the broker {safe} cannot be reached: {exc}") from exc


def use_broker(url: str) -> None:
    """Publish to `url` from now on (settings may be read after this module was imported), with
    the transport options it needs (a sentinel:// URL: the master's name, clarion/sentinel.py)."""
    if app.conf.broker_url != url:
        kombu.pools.reset()  # close pooled connections to any other broker
        app._after_fork()  # Celery's own reset of its connection and producer pools
        app.conf.broker_url = url
        options = {
            k: v
            for k, v in (app.conf.broker_transport_options or {}).items()
            if k not in sentinel.OPTION_NAMES  # another broker's: none of them
        }
        more = sentinel.transport_options(url, settings.get().sentinel_master)
        app.conf.broker_transport_options = options | more
