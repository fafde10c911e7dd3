"""One SQLAlchemy engine per process (re-created after fork), and the migration entry point."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from clarion import settings
from clarion.db import partitioning
from clarion.db.schema import SCHEMA_REVISION
from clarion.errors import ConfigurationError

_engines: dict[tuple[int, str], Engine] = {}


@lru_cache(maxsize=64)
def normalise_url(url: str) -> str:
    """Accept postgresql:// and postgres:// URLs; always drive them with psycopg 3. (Cached: every
    statement's engine() call asks, and parsing a URL costs more than the lookup.)"""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def engine(url: str | None = None) -> Engine:
    """The engine for `url` (default: the configured database) in this process."""
    url = normalise_url(url or settings.get().urls()[0])
    key = (os.getpid(), url)
    if key not in _engines:
        # prepare_threshold=0: every statement is a server-side prepared statement from its first
        # run on a connection (psycopg's default prepares on the 5th run). The ledger's statements run
        # thousands of times per connection; measured ~20% less CPU per notification. None of them
        # carries a partial-index predicate as a parameter (DESIGN's auto-prepare trap), and
        # tests/integration/test_claims.py runs the claim 50+ times on one connection.
        created = create_engine(
            url,
            pool_size=10,
            max_overflow=10,
            pool_pre_ping=True,
            connect_args={"prepare_threshold": 0},
        )
        check_schema(created)
        _engines[key] = created
    return _engines[key]


_HAS_VERSIONS = text("SELECT to_regclass('alembic_version') IS NOT NULL")
_REVISION = text("SELECT max(version_num) FROM alembic_version")


def schema_problem(conn: Connection) -> str | None:
    """Why this code cannot use the database `conn` reaches ("not migrated", "at revision
    0009"), or None when it is at this code's revision or newer (migrations are additive, so a
    rolling deploy's older workers keep running). Shared by check_schema and /readyz."""
    found = conn.execute(_REVISION).scalar() if conn.execute(_HAS_VERSIONS).scalar() else None
    if found is not None and str(found) >= SCHEMA_REVISION:
        return None
    return f"at revision {found}" if found else "not migrated"


def check_schema(eng: Engine) -> None:
    """Refuse a database this code cannot use: never migrated, or at an older revision.
    Checked once per process and engine, so a first notify() says what to do instead of failing
    with an SQL traceback about a missing table."""
    try:
        with eng.connect() as conn:
            problem = schema_problem(conn)
    except DBAPIError:
        return  # unreachable now: the caller's own statement reports that, with its retry policy
    if problem is not None:
        where = eng.url.render_as_string(hide_password=True)
        raise ConfigurationError(
            f"the database {where} is {problem}; this clarion needs revision {SCHEMA_REVISION}: "
            "run `clarion migrate`"
        )


def autocommit(url: str | None = None) -> Engine:
    """The same engine (and pool), with every statement committed on its own."""
    return engine(url).execution_options(isolation_level="AUTOCOMMIT")


def dispose_all() -> None:
    """Drop this process's engines (used after fork and at shutdown)."""
    for key in [k for k in _engines if k[0] == os.getpid()]:
        _engines.pop(key).dispose()
    _engines.clear()


def one_off_engine(url: str) -> Engine:
    """An engine that keeps no connections (admin work: creating databases, migrating)."""
    return create_engine(normalise_url(url), poolclass=NullPool, isolation_level="AUTOCOMMIT")


def migrate(
    url: str | None = None,
    revision: str = "head",
    *,
    down: bool = False,
    partitions: int | None = None,
) -> list[str]:
    """Bring the database up (or, with down=True, down) to `revision` with Alembic; then, with
    `partitions` (default CLARION_PARTITIONS) and going up, hash-partition the per-recipient tables
    by user_id (db/partitioning.py) in the same transaction. The tables partitioned now."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    eng = create_engine(normalise_url(url or settings.get().urls()[0]), poolclass=NullPool)
    with eng.begin() as connection:
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)
        parts = partitions if partitions is not None else settings.get().partitions
        done = [] if down or not parts else partitioning.apply(connection, parts)
    eng.dispose()
    return done
