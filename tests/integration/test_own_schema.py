"""clarion in its own PostgreSQL schema beside a host app (issue 22, item 2): migrate into a
database that holds a host's tables and Alembic history, a schema of another name end to end, the
move of a deployment still in `public`, and the outbox on the host's own connection."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, create_engine, text

from clarion import settings
from clarion.db import partitioning
from clarion.db.engine import alembic_config, dispose_all, engine, migrate, normalise_url
from clarion.db.schema import SCHEMA_REVISION, metadata
from clarion.errors import ConfigurationError, UnknownRecipient
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.preferences import set_preferences
from clarion.tasks.route import route
from clarion.tasks.series import arm_series, pause_series
from clarion.tasks.tick import tick
from tests.support.pipeline import configure, count, frozen_clock, publishing_to_this_tests_broker

pytestmark = pytest.mark.integration

ORDER = {"order": "A-1"}
TABLES = sorted(metadata.tables)
HOST_ROWS = [("h1", "dark"), ("h2", "light")]
OURS_NOT_TABLES = ("inbox_revisions", "requests_pin_locale")  # the sequence and the function

_WHERE = text(
    """
    SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relname = ANY(:names) AND c.relkind IN ('r', 'p', 'S')
    UNION ALL
    SELECT n.nspname, p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE p.proname = ANY(:names)
    """
)


def plain(url: str):
    """An engine as a host app makes it: PostgreSQL's default search_path ("$user", public)."""
    return create_engine(normalise_url(url))


def host_app(conn: Connection, revision: str = "host_0042") -> None:
    """A host app's own tables in public: `preferences` (a name clarion uses too) and its Alembic
    history."""
    conn.execute(text("CREATE TABLE preferences (account text PRIMARY KEY, theme text NOT NULL)"))
    conn.execute(text("INSERT INTO preferences VALUES ('h1', 'dark'), ('h2', 'light')"))
    conn.execute(
        text(
            "CREATE TABLE alembic_version (version_num varchar(32) NOT NULL, "
            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
    )
    conn.execute(text("INSERT INTO alembic_version VALUES (:r)"), {"r": revision})


def host_state(conn: Connection) -> dict[str, Any]:
    return {
        "preferences": [tuple(r) for r in conn.execute(text("SELECT * FROM public.preferences"))],
        "version": list(conn.execute(text("SELECT * FROM public.alembic_version")).scalars()),
    }


def placement(conn: Connection) -> dict[str, set[str]]:
    """Schema -> clarion's objects (tables, the sequence, the function) found in it."""
    found: dict[str, set[str]] = {}
    for schema, name in conn.execute(_WHERE, {"names": TABLES + list(OURS_NOT_TABLES)}):
        found.setdefault(schema, set()).add(name)
    return found


def in_public(conn: Connection) -> list[str]:
    """Everything in public: the host's alone must be there."""
    return sorted(
        conn.execute(
            text(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public'"
            )
        ).scalars()
    )


@pytest.fixture
def host_db(unmigrated_database: str) -> Iterator[str]:
    """A database holding a host app (and nothing of clarion's)."""
    eng = plain(unmigrated_database)
    with eng.begin() as conn:
        host_app(conn)
    eng.dispose()
    yield unmigrated_database


@pytest.mark.direct(
    "a database or schema of its own the pooler fixture has not given its search_path"
)
@pytest.mark.parametrize("partitions", [None, 2])
def test_migrate_beside_a_host_app_leaves_its_tables_and_history_alone(host_db, partitions):
    eng = plain(host_db)
    with eng.connect() as conn:
        before, public_before = host_state(conn), in_public(conn)

    migrate(host_db, partitions=partitions)

    with eng.connect() as conn:
        assert host_state(conn) == before == {"preferences": HOST_ROWS, "version": ["host_0042"]}
        assert in_public(conn) == public_before  # nothing of clarion's in public
        where = placement(conn)
        assert where.keys() == {"clarion", "public"}
        assert where["public"] == {"preferences"}  # the host's own table of that name
        assert where["clarion"] == set(TABLES) | set(OURS_NOT_TABLES)
        version = conn.execute(text("SELECT version_num FROM clarion.alembic_version"))
        assert list(version.scalars()) == [SCHEMA_REVISION]
        partitioned = conn.execute(
            text("SELECT count(*) FROM pg_class WHERE relnamespace = to_regnamespace(:s)"),
            {"s": "clarion_partitions"},
        ).scalar()
        assert bool(partitioned) == bool(partitions)  # the partitions, in clarion_partitions
    assert engine(host_db)  # check_schema reads clarion's version table: at head

    dispose_all()
    migrate(host_db, "base", down=True)
    with eng.connect() as conn:
        assert host_state(conn) == before
        assert in_public(conn) == public_before
        assert placement(conn).keys() == {"public"}
        schemas = conn.execute(
            text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'clarion%'")
        )
        assert list(schemas.scalars()) == []  # clarion's schemas were emptied and dropped
    eng.dispose()


@pytest.mark.direct(
    "a database or schema of its own the pooler fixture has not given its search_path"
)
def test_a_schema_of_another_name_works_end_to_end(host_db, monkeypatch):
    configure(monkeypatch, database_url=host_db, schema="acme_notify")
    dispose_all()
    migrate()
    register_recipient("ann", timezone="Europe/Berlin")
    with Receiver(settings.get().webhook_secret) as receiver, publishing_to_this_tests_broker():
        configure(monkeypatch, webhook_url=receiver.url)
        enqueued = notify("ann", "receipt", event_id="e1", variables=ORDER)
        assert route(["ann"], [enqueued.request_id]) == 1
        assert receiver.arrivals.total == 1
    assert count("deliveries", "state = 'sent'") == 1
    eng = plain(host_db)
    with eng.connect() as conn:
        where = placement(conn)
        assert where.keys() == {"acme_notify", "public"}
        assert where["acme_notify"] == set(TABLES) | set(OURS_NOT_TABLES)
        state = conn.execute(text("SELECT state FROM acme_notify.requests")).scalar_one()
        assert state == "routed"
        assert host_state(conn)["version"] == ["host_0042"]
    eng.dispose()


# --- moving a deployment from public -------------------------------------------------------

OLD_ROWS = """
INSERT INTO recipients (user_id, timezone, locale, created_at, updated_at)
    VALUES ('ann', 'Europe/Berlin', 'de', now(), now()), ('bob', 'UTC', 'en', now(), now());
INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version, variables,
    state, created_at)
    VALUES ('ann', 'receipt', 'event:e1', 'transactional', 1, '{"order": "A-1"}', 'routed', now()),
           ('bob', 'receipt', 'event:e2', 'transactional', 1, '{"order": "B-1"}', 'routed', now());
INSERT INTO deliveries (user_id, request_id, type_key, occurrence_key, channel, one_platform, lane,
    state, platform, not_before, created_at, updated_at, sent_at)
    SELECT user_id, id, type_key, occurrence_key, 'webhook', false, lane, 'sent', 'webhook',
        now(), now(), now(), now() FROM requests;
INSERT INTO decisions (user_id, request_id, gate, outcome, reason, decided_at)
    SELECT user_id, id, 'preferences', 'allow', 'default', now() FROM requests;
INSERT INTO preferences (user_id, scope, key, channel, enabled, updated_at)
    VALUES ('bob', 'category', 'marketing', '*', false, now());
INSERT INTO series (user_id, series_key, type_key, anchor_local, zone, every, calendar_policy,
    variables, state, next_n, next_due_at, created_at, updated_at)
    VALUES ('ann', 'weekly', 'nudge', '2026-01-05 09:00', 'Europe/Berlin', '1w', 'send', '{}',
        'active', 0, now() + interval '1 day', now(), now());
INSERT INTO inbox_items (user_id, delivery_id, type_key, rev, created_rev, wxid, created_at,
    updated_at)
    SELECT user_id, id, type_key, nextval('inbox_revisions'), currval('inbox_revisions'), 1,
        now(), now() FROM deliveries WHERE user_id = 'ann';
"""


def old_layout(url: str, partitions: int | None) -> None:
    """Today's (pre-0018) deployment, built the old way: the migrations to 0017 run with public as
    the search_path and the version table, partitions (if any) in clarion_partitions; and rows."""
    eng = plain(url)
    with eng.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        config.attributes["schema"] = "public"
        command.upgrade(config, "0017")
        if partitions:
            partitioning.apply(conn, partitions)  # into <current_schema()>_partitions
            conn.execute(text("ALTER SCHEMA public_partitions RENAME TO clarion_partitions"))
        conn.execute(text(OLD_ROWS))
    eng.dispose()


def row_counts(
    conn: Connection, schema: str, tables: Iterable[str] | None = None
) -> dict[str, int]:
    """Rows per clarion table in `schema` (default: those of today's tables it holds: a deployment
    at 0017 has none of the tables later revisions add)."""
    if tables is None:
        held = conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema}
        ).scalars()
        tables = sorted(set(held) & set(TABLES))
    return {
        t: conn.execute(text(f'SELECT count(*) FROM "{schema}"."{t}"')).scalar_one() for t in tables
    }


@pytest.mark.parametrize(
    ("partitions", "schema"), [(None, "clarion"), (2, "clarion"), (2, "acme_notify")]
)
@pytest.mark.direct(
    "a database or schema of its own the pooler fixture has not given its search_path"
)
def test_a_deployment_in_public_moves_into_the_schema_with_its_rows(
    unmigrated_database, monkeypatch, partitions, schema
):
    url = unmigrated_database
    old_layout(url, partitions)
    eng = plain(url)
    with eng.connect() as conn:
        before = row_counts(conn, "public")
        assert list(conn.execute(text("SELECT * FROM public.alembic_version")).scalars()) == [
            "0017"
        ]
        revision_before = conn.execute(text("SELECT last_value FROM inbox_revisions")).scalar()
    assert before["deliveries"] == 2 and before["inbox_items"] == 1

    configure(monkeypatch, database_url=url, schema=schema)
    dispose_all()
    migrate()

    with eng.connect() as conn:
        assert row_counts(conn, schema, before) == before
        assert placement(conn).keys() == {schema}  # nothing of clarion's left in public
        assert in_public(conn) == []  # public's alembic_version was clarion's: moved too
        version = conn.execute(text(f"SELECT version_num FROM {schema}.alembic_version"))
        assert list(version.scalars()) == [SCHEMA_REVISION]
        parts = conn.execute(
            text("SELECT count(*) FROM pg_class WHERE relnamespace = to_regnamespace(:s)"),
            {"s": f"{schema}_partitions"},
        ).scalar()
        assert bool(parts) == bool(partitions)
    # the once-only key survived the move: the sent occurrence is not requested again
    again = notify("ann", "receipt", event_id="e1", variables=ORDER)
    assert not again.new
    assert count("deliveries", "state = 'sent' AND occurrence_key = 'event:e1'") == 1
    # identities and the inbox sequence go on from where they were
    fresh = notify("ann", "receipt", event_id="e3", variables=ORDER)
    with engine().connect() as conn:
        older = conn.execute(
            text("SELECT max(id) FROM requests WHERE id <> :i"), {"i": fresh.request_id}
        )
        assert fresh.new and fresh.request_id > older.scalar_one()
        assert conn.execute(text("SELECT nextval('inbox_revisions')")).scalar() > revision_before
        # the trigger still pins the recipient's locale, from clarion's schema
        locale = conn.execute(
            text("SELECT locale FROM requests WHERE id = :i"), {"i": fresh.request_id}
        )
        assert locale.scalar_one() == "de"
    assert count("requests") == before["requests"] + 1
    eng.dispose()


def test_a_version_table_shared_with_a_host_history_is_refused_and_left_alone(unmigrated_database):
    old_layout(unmigrated_database, None)
    eng = plain(unmigrated_database)
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO alembic_version VALUES ('host_0042')"))
        before = row_counts(conn, "public")
    with pytest.raises(
        ConfigurationError, match=r"clarion's revision\(s\) \['0017'\] and others \['host_0042'\]"
    ):
        migrate(unmigrated_database)
    with eng.connect() as conn:
        assert row_counts(conn, "public", before) == before
        versions = conn.execute(text("SELECT version_num FROM public.alembic_version ORDER BY 1"))
        assert list(versions.scalars()) == ["0017", "host_0042"]
        assert placement(conn).keys() == {"public"}
    eng.dispose()


# --- the outbox on the host's own connection ---------------------------------------------------


@pytest.fixture
def shared(clarion_env, monkeypatch) -> Iterator[tuple[Any, Receiver]]:
    """This test's clarion database with a host app in public (its `preferences`, its history),
    the host's engine, and a receiver as the webhook endpoint."""
    eng = plain(clarion_env.database_url)
    with eng.begin() as conn:
        host_app(conn)
    with Receiver(settings.get().webhook_secret) as running, publishing_to_this_tests_broker():
        configure(monkeypatch, webhook_url=running.url)
        yield eng, running
    eng.dispose()


def _host_order(conn: Connection, account: str) -> int:
    """The host's own work in its transaction, around clarion's calls: its `preferences`."""
    conn.execute(text("INSERT INTO preferences VALUES (:a, 'dark')"), {"a": account})
    return conn.execute(text("SELECT count(*) FROM preferences")).scalar_one()


@pytest.mark.direct(
    "a host app's connection in autocommit gets a session search_path switch; behind a pooler hand clarion one inside a transaction (docs/beyond-one-machine.md)"
)
def test_outbox_on_a_host_connection_committed_is_sent(shared):
    eng, receiver = shared
    with frozen_clock(), eng.begin() as conn:
        path = conn.execute(text("SHOW search_path")).scalar_one()
        assert _host_order(conn, "h3") == 3
        register_recipient("cat", timezone="UTC", connection=conn)
        set_preferences("cat", {"type:nudge": False}, connection=conn)
        armed = arm_series(
            "cat",
            "nudge",
            anchor="2030-01-07T09:00",
            every="1w",
            variables={"name": "Cat"},
            connection=conn,
        )
        assert pause_series("cat", armed.series_id, connection=conn)
        enqueued = notify("cat", "receipt", event_id="e1", variables=ORDER, connection=conn)
        # the host's later statements in the same transaction see the host's tables
        assert conn.execute(text("SHOW search_path")).scalar_one() == path
        themes = conn.execute(text("SELECT account, theme FROM preferences ORDER BY account"))
        assert [tuple(r) for r in themes] == HOST_ROWS + [("h3", "dark")]
        assert count("requests") == 0  # clarion sees nothing before the host commits
    assert count("requests") == 1 and count("preferences") == 1 and count("series") == 1
    assert tick()["requests"] == 1  # the outbox row is published by the next beat tick
    assert route(["cat"], [enqueued.request_id]) == 1
    assert count("deliveries", "state = 'sent'") == 1
    assert receiver.arrivals.total == 1
    with eng.connect() as conn:
        assert host_state(conn) == {
            "preferences": HOST_ROWS + [("h3", "dark")],
            "version": ["host_0042"],
        }


@pytest.mark.direct(
    "a host app's connection in autocommit gets a session search_path switch; behind a pooler hand clarion one inside a transaction (docs/beyond-one-machine.md)"
)
def test_outbox_on_a_host_connection_rolled_back_never_existed(shared):
    eng, receiver = shared

    class HostFailed(Exception):
        pass

    with engine().connect() as conn:
        before = row_counts(conn, "clarion")
    assert before["requests"] == before["recipients"] == 0
    with (
        pytest.raises(HostFailed, match=r"^the host app failed after clarion wrote$"),
        eng.begin() as conn,
    ):
        _host_order(conn, "h3")
        register_recipient("cat", timezone="UTC", connection=conn)
        notify("cat", "receipt", event_id="e1", variables=ORDER, connection=conn)
        raise HostFailed("the host app failed after clarion wrote")
    with engine().connect() as conn:
        assert row_counts(conn, "clarion") == before
    assert tick()["requests"] == 0
    assert receiver.arrivals.total == 0
    with eng.connect() as conn:
        assert host_state(conn)["preferences"] == HOST_ROWS


@pytest.mark.direct(
    "a host app's connection in autocommit gets a session search_path switch; behind a pooler hand clarion one inside a transaction (docs/beyond-one-machine.md)"
)
def test_a_refused_call_on_a_host_connection_gives_back_the_hosts_search_path(shared):
    eng, _ = shared
    with eng.begin() as conn:
        path = conn.execute(text("SHOW search_path")).scalar_one()
        with pytest.raises(UnknownRecipient, match="nobody"):
            notify("nobody", "receipt", event_id="e1", variables=ORDER, connection=conn)
        assert conn.execute(text("SHOW search_path")).scalar_one() == path
        assert _host_order(conn, "h3") == 3
