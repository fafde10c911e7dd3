"""One SQLAlchemy engine per process (re-created after fork), and the migration entry point."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.pool import ConnectionPoolEntry, NullPool

from clarion import settings
from clarion.db import arrays, partitioning, relocate
from clarion.db.schema import SCHEMA_REVISION
from clarion.errors import ConfigurationError

if TYPE_CHECKING:
    from alembic.config import Config

_engines: dict[tuple[int, str, str], Engine] = {}
T = TypeVar("T")
# Set in a connection's pool record (Connection.info) when clarion's search_path is its own.
_PATH_KEY = "clarion_search_path"
_RESTED_KEY = "clarion_rested_since"  # time.monotonic() when the connection went back to the pool


@lru_cache(maxsize=64)
def normalise_url(url: str) -> str:
    """Accept postgresql:// and postgres:// URLs; always drive them with psycopg 3. (Cached: every
    statement's engine() call asks, and parsing a URL costs more than the lookup.)"""
    parsed = make_url(_hosts_as_query(url))
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _hosts_as_query(url: str) -> str:
    """libpq's multi-host URL (`postgresql://u@h1:5432,h2:5432/db`, as `pg_autoctl show uri`
    prints it) in the form SQLAlchemy reads (`postgresql://u@/db?host=h1:5432&host=h2:5432`)."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return url
    query = "&".join([*(f"host={h}" for h in hosts.split(",")), *filter(None, [parts.query])])
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}", query=query))


def driver_args(url: str) -> dict[str, Any]:
    """psycopg.connect's keyword arguments for `url`, every host of a multi-host URL included
    (for the few places that talk to PostgreSQL without SQLAlchemy)."""
    from sqlalchemy.dialects.postgresql.psycopg import dialect

    psycopg_dialect = dialect()  # type: ignore[no-untyped-call]
    _, kwargs = psycopg_dialect.create_connect_args(make_url(normalise_url(url)))  # type: ignore[no-untyped-call]
    kwargs.pop("context", None)  # SQLAlchemy's adapters
    return dict(kwargs)


def engine(url: str | None = None) -> Engine:
    """The engine for `url` (default: the configured database) in this process."""
    url = normalise_url(url or settings.get().urls()[0])
    key = (os.getpid(), url, settings.get().schema)
    if key not in _engines:
        # prepare_threshold=0: every statement is a server-side prepared statement from its first
        # run on a connection (psycopg's default prepares on the 5th run). The ledger's statements run
        # thousands of times per connection; measured ~20% less CPU per notification. None of them
        # carries a partial-index predicate as a parameter (DESIGN's auto-prepare trap), and
        # tests/integration/test_claims.py runs the claim 50+ times on one connection.
        # Behind a transaction pooler (CLARION_DATABASE_POOLER=transaction) consecutive
        # transactions may run on different server connections: nothing is prepared.
        pooled = pooled_transactions()
        created = create_engine(
            url,
            pool_size=10,
            max_overflow=10,
            connect_args={"prepare_threshold": None if pooled else 0},
        )
        ping_when_stale(created)
        event.listen(
            created, "connect", lambda dbapi_connection, _: arrays.register(dbapi_connection)
        )
        (check_search_path if pooled else use_schema)(created, settings.get().schema)
        check_schema(created)
        _engines[key] = created
    return _engines[key]


PING_IDLE = 1.0  # seconds a pooled connection may rest and still be used without a round trip


def ping_when_stale(eng: Engine) -> None:
    """A pooled connection is checked before use, without a round trip while it is in use: one
    the server closed (a restart, a failover, `pg_terminate_backend`: its socket has the server's
    goodbye or end of file waiting) is replaced at once, found by a zero-timeout poll; one that
    rested more than PING_IDLE seconds is pinged first, as SQLAlchemy's pool_pre_ping pings every
    checkout. A busy worker checks a connection out several times per batch (the route's
    transaction, each sender's, the group commit's): one ping each was a round trip per checkout,
    a few per notification on a receipt's path."""

    @event.listens_for(eng, "checkin")
    def _rested(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info[_RESTED_KEY] = time.monotonic()

    @event.listens_for(eng, "checkout")
    def _check(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        rested = record.info.pop(_RESTED_KEY, None)
        if rested is None:  # just connected
            return
        if _closed_by_server(dbapi_connection) or (
            time.monotonic() - rested > PING_IDLE and not _answers(eng, dbapi_connection)
        ):
            raise DisconnectionError("the server closed the connection")  # the pool reconnects


def _closed_by_server(dbapi_connection: Any) -> bool:
    """An idle connection with anything to read (the server's FATAL message, end of file) or an
    error on its socket, or one psycopg already knows is broken."""
    if dbapi_connection.closed or dbapi_connection.broken:
        return True
    try:
        poller = select.poll()
        poller.register(dbapi_connection.fileno(), select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # no socket any more
        return True


def _answers(eng: Engine, dbapi_connection: Any) -> bool:
    try:
        return bool(eng.dialect.do_ping(dbapi_connection))
    except Exception:  # noqa: BLE001 - any failure to answer is a connection to replace
        return False


def use_schema(eng: Engine, schema: str) -> None:
    """Every connection `eng` opens reads and writes clarion's tables: its search_path is `schema`
    alone (the unqualified names in db/ never reach a host app's tables of the same name)."""

    @event.listens_for(eng, "connect", insert=True)  # first: before SQLAlchemy reads current_schema
    def _search_path(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f'SET search_path TO "{schema}"')
        dbapi_connection.autocommit = autocommit
        record.info[_PATH_KEY] = f'"{schema}"'


def pooled_transactions() -> bool:
    """CLARION_DATABASE_URL leads to a pooler in transaction mode (pgbouncer's pool_mode=transaction)."""
    return settings.get().database_pooler == "transaction"


def check_search_path(eng: Engine, schema: str) -> None:
    """Behind a transaction pooler a session's `SET search_path` stays on whichever server
    connection ran it, and the pooler refuses the `options` startup parameter: clarion's
    search_path must come from the server (`ALTER ROLE ... SET search_path`). Every connection
    `eng` opens checks that it did, and refuses to run clarion's statements elsewhere."""

    @event.listens_for(eng, "connect", insert=True)
    def _check(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT current_user, current_setting('search_path')")
            user, path = cursor.fetchone()
        dbapi_connection.rollback()
        found = path.split(",")[0].strip().strip('"')  # the schema may not exist yet: unmigrated
        if found != schema:
            raise ConfigurationError(
                f"CLARION_DATABASE_POOLER=transaction: the server gives this connection the "
                f"search_path {path!r}, not clarion's {schema!r}; a pooler cannot keep a session "
                f'setting, so run `ALTER ROLE "{user}" SET search_path = "{schema}"` '
                "(or ALTER DATABASE ... SET) on PostgreSQL"
            )
        record.info[_PATH_KEY] = f'"{schema}"'


def timeout_args(connect: float, statement: float) -> dict[str, Any]:
    """psycopg arguments that bound a connect and (server side) each statement, in seconds.
    A transaction pooler refuses startup options: there, pgbouncer's query_timeout bounds them."""
    bounded: dict[str, Any] = {"connect_timeout": max(1, round(connect))}
    if pooled_transactions():
        return bounded | {"prepare_threshold": None}
    return bounded | {"options": f"-c statement_timeout={int(statement * 1000)}"}


_SWITCH = text("SELECT current_setting('search_path'), set_config('search_path', :path, :local)")
_RESTORE = text("SELECT set_config('search_path', :path, :local)")


@contextmanager
def clarion_search_path(conn: Connection) -> Iterator[Connection]:
    """Run clarion's statements on a host app's connection (`notify(..., connection=conn)`): its
    search_path is clarion's schema for the duration, then what it was, so the host's own later
    statements in the same transaction see its own tables. Transaction-local (set_config(..., true)),
    so even a path left set by a failed statement ends with the host's rollback."""
    path = f'"{settings.get().schema}"'
    if conn.info.get(_PATH_KEY) == path:  # one of clarion's own connections
        yield conn
        return
    local = not getattr(conn.connection.dbapi_connection, "autocommit", False)
    before = conn.execute(_SWITCH, {"path": path, "local": local}).scalar_one()
    aborted = False
    try:
        yield conn
    except DBAPIError:
        aborted = True  # the transaction is aborted: only its rollback (which restores) can follow
        raise
    finally:
        if not aborted:
            conn.execute(_RESTORE, {"path": before, "local": local})


def in_transaction(connection: Connection | None, work: Callable[[Connection], T]) -> T:
    """Run `work` in the caller's transaction (on clarion's tables), or in a new one of its own."""
    if connection is not None:
        with clarion_search_path(connection):
            return work(connection)
    with engine().begin() as conn:
        return work(conn)


_HAS_VERSIONS = text("SELECT to_regclass(format('%I.alembic_version', CAST(:schema AS text)))")


def schema_problem(conn: Connection) -> str | None:
    """Why this code cannot use the database `conn` reaches ("not migrated", "at revision
    0009"), or None when it is at this code's revision or newer (migrations are additive, so a
    rolling deploy's older workers keep running). Shared by check_schema and /readyz."""
    schema = settings.get().schema  # an identifier checked by settings: safe to quote into SQL
    found = None
    if conn.execute(_HAS_VERSIONS, {"schema": schema}).scalar() is not None:
        found = conn.execute(
            text(f'SELECT max(version_num) FROM "{schema}".alembic_version')
        ).scalar()
    if found is not None and str(found) >= SCHEMA_REVISION:
        return None
    return f"at revision {found} (schema {schema})" if found else f"not migrated (schema {schema})"


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
    """Bring clarion's schema (CLARION_SCHEMA) up (or, with down=True, down) to `revision` with
    Alembic, its version in `<schema>.alembic_version`; a database whose clarion tables are still in
    `public` (before revision 0018) is moved into the schema first (db/relocate.py). Then, with
    `partitions` (default CLARION_PARTITIONS) and going up, hash-partition the per-recipient tables
    by user_id (db/partitioning.py) in the same transaction. The tables partitioned now. Nothing
    outside clarion's schemas is read or written, except a `public.alembic_version` of clarion's."""
    from alembic import command

    schema = settings.get().schema
    eng = create_engine(normalise_url(url or settings.get().urls()[0]), poolclass=NullPool)
    with eng.begin() as connection:
        # one migration at a time per schema (two `clarion migrate` racing on CREATE SCHEMA)
        connection.execute(text("SELECT pg_advisory_xact_lock(hashtext(:s))"), {"s": schema})
        if not down:
            connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            relocate.from_public(connection, schema, relocate.revisions(alembic_config()))
        connection.execute(text("SELECT set_config('search_path', :p, true)"), {"p": schema})
        config = alembic_config()
        config.attributes["connection"] = connection
        config.attributes["schema"] = schema
        (command.downgrade if down else command.upgrade)(config, revision)
        parts = partitions if partitions is not None else settings.get().partitions
        done = [] if down or not parts else partitioning.apply(connection, parts)
        if down and revision == "base":
            relocate.drop_if_empty(connection, schema)
    eng.dispose()
    return done


def alembic_config() -> Config:
    """Alembic's configuration for clarion's migrations (db/migrations)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    return config
