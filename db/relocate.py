"""Moving a deployment from `public` into clarion's own schema, and clearing the schema on the way down.

Before revision 0018 clarion's tables, its sequence, its trigger function and its Alembic version
(`public.alembic_version`) lived in `public`. `clarion migrate` finds such a deployment by that
version table holding clarion's revisions and nothing else, and moves it, in the migration's own
transaction, before Alembic runs: ALTER … SET SCHEMA for every table (a partitioned one keeps its
partitions, which live in `<schema>_partitions`), the sequence and the function (identity sequences,
indexes, constraints and triggers follow their tables), then the version table itself, so the
version row is in `<schema>.alembic_version` and no longer in `public`. Rows are not copied: it is
a catalog change, as fast for a million rows as for ten.

A `public.alembic_version` holding other revisions belongs to a host app: with none of clarion's
it is left alone (a fresh install goes into the schema); with clarion's and others' mixed (one
version table shared by two histories) nothing is moved and migrate refuses, saying what it found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Connection, text

from clarion.db.partitioning import SUFFIX
from clarion.db.schema import metadata
from clarion.errors import ConfigurationError

if TYPE_CHECKING:
    from alembic.config import Config

LEGACY_PARTITIONS = "clarion_partitions"  # where partitions lived before 0018, whatever the schema
FUNCTIONS = ("requests_pin_locale()",)  # every function a migration creates (0015)
SEQUENCES = ("inbox_revisions",)  # every sequence not owned by a column (0008)

_VERSIONS = text("SELECT version_num FROM public.alembic_version")
_HAS_PUBLIC_VERSIONS = text("SELECT to_regclass('public.alembic_version') IS NOT NULL")
_HAS_VERSIONS = text("SELECT to_regclass(format('%I.alembic_version', CAST(:s AS text)))")
_IN_PUBLIC = text(
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname = ANY(:names) "
    "ORDER BY c.relname"
)
_SCHEMA_EXISTS = text("SELECT to_regnamespace(:s) IS NOT NULL")
_SCHEMA_EMPTY = text(
    """
    SELECT NOT EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = to_regnamespace(:s))
       AND NOT EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = to_regnamespace(:s))
       AND NOT EXISTS (SELECT 1 FROM pg_type WHERE typnamespace = to_regnamespace(:s))
    """
)


def revisions(config: Config) -> frozenset[str]:
    """Every revision id clarion's migrations define."""
    from alembic.script import ScriptDirectory

    return frozenset(s.revision for s in ScriptDirectory.from_config(config).walk_revisions())


def from_public(conn: Connection, schema: str, ours: frozenset[str]) -> str | None:
    """Move a pre-0018 deployment from `public` into `schema` (which exists); the revision it was at,
    or None when `public` holds no clarion deployment (nothing is touched then)."""
    if not conn.execute(_HAS_PUBLIC_VERSIONS).scalar():
        return None
    found: set[str] = set(conn.execute(_VERSIONS).scalars())
    if not found & ours:
        return None  # a host app's Alembic history: not ours to read further or change
    if found - ours:
        raise ConfigurationError(
            f"public.alembic_version holds clarion's revision(s) {sorted(found & ours)} and "
            f"others {sorted(found - ours)}: clarion will not move a version table it shares; "
            "move clarion's tables by hand or remove the other app's rows first"
        )
    if conn.execute(_HAS_VERSIONS, {"s": schema}).scalar():
        raise ConfigurationError(
            f"clarion's tables are both in public (revision {max(found)}) and in schema {schema}: "
            "remove one of them, then run `clarion migrate` again"
        )
    tables = list(conn.execute(_IN_PUBLIC, {"names": list(metadata.tables)}).scalars())
    for table in tables:
        conn.execute(text(f'ALTER TABLE public."{table}" SET SCHEMA "{schema}"'))
    for sequence in SEQUENCES:
        conn.execute(text(f'ALTER SEQUENCE IF EXISTS public."{sequence}" SET SCHEMA "{schema}"'))
    for function in FUNCTIONS:  # (ALTER FUNCTION has no IF EXISTS)
        if conn.execute(text("SELECT to_regprocedure(:f)"), {"f": f"public.{function}"}).scalar():
            conn.execute(text(f'ALTER FUNCTION public.{function} SET SCHEMA "{schema}"'))
    partitions = f"{schema}{SUFFIX}"
    if (
        partitions != LEGACY_PARTITIONS
        and conn.execute(_SCHEMA_EXISTS, {"s": LEGACY_PARTITIONS}).scalar()
    ):
        conn.execute(text(f'ALTER SCHEMA {LEGACY_PARTITIONS} RENAME TO "{partitions}"'))
    conn.execute(text(f'ALTER TABLE public.alembic_version SET SCHEMA "{schema}"'))
    return max(found)


def drop_if_empty(conn: Connection, schema: str) -> None:
    """After a migration down to base: drop clarion's version table, then its schemas if nothing
    else is left in them (anything another app put there keeps them)."""
    conn.execute(text(f'DROP TABLE IF EXISTS "{schema}".alembic_version'))
    for name in (f"{schema}{SUFFIX}", schema):
        if (
            conn.execute(_SCHEMA_EXISTS, {"s": name}).scalar()
            and conn.execute(_SCHEMA_EMPTY, {"s": name}).scalar()
        ):
            conn.execute(text(f'DROP SCHEMA "{name}"'))
