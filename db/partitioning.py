"""Hash partitioning by user_id: the per-recipient tables as PostgreSQL declarative partitions.

The same shape Citus distributes (a table split by a hash of user_id, every unique index holding
user_id), on stock PostgreSQL, so the schema's readiness for it is tested, not claimed. It is a
layout, not an Alembic revision: `clarion migrate --partitions N` (or CLARION_PARTITIONS=N)
upgrades to head first and then rebuilds each plain table of PARTITIONED as a partitioned one, in
the same transaction. That way the revisions stay one linear chain that runs on either layout
(PostgreSQL carries ADD COLUMN and CREATE INDEX on a partitioned table down to its partitions), and a
table a later revision adds to PARTITIONED is partitioned by the next `migrate --partitions N`.
Running it again changes nothing; a database partitioned with another N is refused.

Each rebuild keeps names: columns (LIKE, with defaults, identity, CHECKs), the primary key and
unique constraints, the other indexes, the statistics settings LIKE does not copy (the table's
storage parameters, such as migration 0027's autovacuum thresholds, on each partition; its
columns' options, such as user_id's pinned n_distinct, on the parent and each partition), the triggers (recreated after the rows are copied, so the
copy does not fire them), the foreign keys out of the table and into it, and the identity
sequence's position. The partitions live in the schema `<CLARION_SCHEMA>_partitions`
(`clarion_partitions`), beside clarion's own (where the schema check compares tables with
db/schema.py). Rows are copied: fine
for a new or small deployment; a large one would partition by pg_dump/restore or logical
replication, and a Citus one calls create_distributed_table instead (docs/beyond-one-machine.md).

Not partitioned: tables not per recipient (clarion_meta, api_keys, api_idempotency, alerts,
suppression_lifts, all small), and fatigue_counters: an org's cap is one counter shared by all the
org's users, and split by a user-derived partition it would admit up to the cap in every partition
(docs/beyond-one-machine.md says what to do with it on Citus).
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from clarion.errors import ConfigurationError

SUFFIX = "_partitions"  # the partitions of schema S live in schema S_partitions
PARTITIONED = (
    "recipients",
    "requests",
    "deliveries",
    "decisions",
    "receipts",
    "incidents",
    "delivery_attempts",
    "preferences",
    "suppressions",
    "activation_windows",
    "collapse_groups",
    "series",
    "interactions",
    "inbox_items",
    "escalations",
    "escalation_requests",
    "digests",
    "collapse_refreshes",
    "topic_members",
)
MAX_PARTITIONS = 256

_COUNT = text(
    """
    SELECT c.relname, count(i.inhrelid) FROM pg_class c
    JOIN pg_namespace s ON s.oid = c.relnamespace AND s.nspname = current_schema()
    LEFT JOIN pg_inherits i ON i.inhparent = c.oid
    WHERE c.relname = ANY(CAST(:tables AS text[])) AND c.relkind IN ('r', 'p')
    GROUP BY c.relname, c.relkind HAVING c.relkind = 'p'
    """
)
_EXISTING = text(
    "SELECT relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace "
    "WHERE s.nspname = current_schema() AND relkind = 'r' AND relname = ANY(CAST(:tables AS text[]))"
)
_OWN_CONSTRAINTS = text(
    """
    SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
    WHERE conrelid = CAST(:t AS regclass) AND contype IN ('p', 'u', 'f', 'x') AND conparentid = 0
    ORDER BY contype = 'f', conname
    """
)
_INBOUND = text(
    """
    SELECT CAST(conrelid AS regclass)::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
    WHERE confrelid = CAST(:t AS regclass) AND conrelid <> confrelid AND contype = 'f'
      AND conparentid = 0
    """
)
_INDEXES = text(
    """
    SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
    WHERE i.indrelid = CAST(:t AS regclass)
      AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
    """
)
_TRIGGERS = text(
    """
    SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
    WHERE t.tgrelid = CAST(:t AS regclass) AND NOT t.tgisinternal ORDER BY t.tgname
    """
)
_CHILD_INDEXES = text(
    """
    SELECT c.relname, p.relname, part.relname FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    JOIN pg_class p ON p.oid = i.inhparent AND p.relkind = 'I'
    JOIN pg_index x ON x.indexrelid = c.oid
    JOIN pg_class part ON part.oid = x.indrelid
    JOIN pg_inherits pi ON pi.inhrelid = part.oid AND pi.inhparent = CAST(:t AS regclass)
    """
)
# Settings LIKE does not copy: the table's storage parameters (autovacuum's, migration 0027) and
# its columns' attribute options (user_id's pinned n_distinct, 0027). Only the planner options
# PostgreSQL documents for columns are carried: some builds keep entries of their own in
# attoptions (Debian's 15.20 puts a pg_attver=N on every column), which are not ours to copy.
COLUMN_OPTIONS = ("n_distinct", "n_distinct_inherited")


def planner_options(attoptions: list[str] | None) -> list[str]:
    """The entries of a column's attoptions that are PostgreSQL's planner options."""
    return [o for o in attoptions or [] if o.split("=", 1)[0] in COLUMN_OPTIONS]


_RELOPTIONS = text("SELECT reloptions FROM pg_class WHERE oid = CAST(:t AS regclass)")
_ATTOPTIONS = text(
    "SELECT attname, attoptions FROM pg_attribute WHERE attrelid = CAST(:t AS regclass) "
    "AND attnum > 0 AND NOT attisdropped AND attoptions IS NOT NULL ORDER BY attnum"
)
_IDENTITY = text(
    "SELECT attname FROM pg_attribute WHERE attrelid = CAST(:t AS regclass) AND attidentity <> ''"
)


def partition_counts(conn: Connection) -> dict[str, int]:
    """Each table of PARTITIONED that is partitioned, with its number of partitions."""
    return {r[0]: int(r[1]) for r in conn.execute(_COUNT, {"tables": list(PARTITIONED)})}


def apply(conn: Connection, partitions: int) -> list[str]:
    """Hash-partition every plain table of PARTITIONED by user_id into `partitions` parts; the
    names of the tables rebuilt now (none when all already are). Inside the caller's transaction."""
    if not 2 <= partitions <= MAX_PARTITIONS:
        raise ConfigurationError(f"partitions must be from 2 to {MAX_PARTITIONS}, not {partitions}")
    other = {t: n for t, n in partition_counts(conn).items() if n != partitions}
    if other:
        raise ConfigurationError(
            f"the database is already partitioned with {sorted(set(other.values()))} partitions "
            f"({', '.join(sorted(other))}), not {partitions}: repartitioning is not supported"
        )
    plain = {r[0] for r in conn.execute(_EXISTING, {"tables": list(PARTITIONED)})}
    todo = [t for t in PARTITIONED if t in plain]
    where = f'"{conn.execute(text("SELECT current_schema()")).scalar_one()}{SUFFIX}"'
    if todo:
        conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {where}"))
    for table in todo:
        _rebuild(conn, table, partitions, where)
    return todo


def _rebuild(conn: Connection, table: str, partitions: int, where: str) -> None:
    params = {"t": table}
    own = conn.execute(_OWN_CONSTRAINTS, params).all()
    inbound = conn.execute(_INBOUND, params).all()
    indexes = [r[0] for r in conn.execute(_INDEXES, params)]
    triggers = [r[0] for r in conn.execute(_TRIGGERS, params)]  # read before the rename
    identity = [r[0] for r in conn.execute(_IDENTITY, params)]
    reloptions = conn.execute(_RELOPTIONS, params).scalar_one() or []
    attoptions = [
        (r[0], ours) for r in conn.execute(_ATTOPTIONS, params) if (ours := planner_options(r[1]))
    ]
    positions = {
        col: conn.execute(
            text(f"SELECT last_value, is_called FROM {_sequence(conn, table, col)}")
        ).one()
        for col in identity
    }
    old = f"{table}__plain"
    conn.execute(text(f'ALTER TABLE "{table}" RENAME TO "{old}"'))
    conn.execute(
        text(
            f'CREATE TABLE "{table}" (LIKE "{old}" INCLUDING DEFAULTS INCLUDING IDENTITY '
            "INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS) PARTITION BY HASH (user_id)"
        )
    )
    for i in range(partitions):
        conn.execute(
            text(
                f'CREATE TABLE {where}."{table}_p{i}" PARTITION OF "{table}" '
                f"FOR VALUES WITH (MODULUS {partitions}, REMAINDER {i})"
            )
        )
    _carry_settings(conn, table, where, partitions, reloptions, attoptions)
    conn.execute(text(f'INSERT INTO "{table}" OVERRIDING SYSTEM VALUE SELECT * FROM "{old}"'))
    for col, (last, called) in positions.items():
        conn.execute(
            text(f'ALTER TABLE "{table}" ALTER COLUMN "{col}" RESTART WITH {last + int(called)}')
        )
    conn.execute(text(f'DROP TABLE "{old}" CASCADE'))  # its indexes and inbound keys with it
    for name, definition in own:
        conn.execute(text(f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}'))
    for definition in indexes + triggers:
        conn.execute(text(definition))
    for source, name, definition in inbound:
        conn.execute(text(f'ALTER TABLE {source} ADD CONSTRAINT "{name}" {definition}'))
    for child, parent, partition in conn.execute(_CHILD_INDEXES, {"t": table}):
        # "deliveries_one_send_p0", not "deliveries_p0_user_id_type_key_occurrence_key_channel_idx":
        # a violation names the partition's index, and should still say which rule it broke
        suffix = partition.removeprefix(f"{table}_")
        conn.execute(text(f'ALTER INDEX {where}."{child}" RENAME TO "{parent}_{suffix}"'))


def _carry_settings(
    conn: Connection,
    table: str,
    where: str,
    partitions: int,
    reloptions: list[str],
    attoptions: list[tuple[str, list[str]]],
) -> None:
    """The plain table's statistics settings on its partitions, where the planner and autovacuum
    read them (each partition is a table of its own, analyzed and vacuumed on its own), and its
    columns' options on the parent too, so the layout keeps what the migrations set. A
    partitioned parent takes no storage parameters (PostgreSQL refuses them)."""
    targets = [f'{where}."{table}_p{i}"' for i in range(partitions)]
    for name in targets:
        if reloptions:
            conn.execute(text(f"ALTER TABLE {name} SET ({', '.join(reloptions)})"))
    for column, options in attoptions:
        for name in [f'"{table}"', *targets]:
            conn.execute(
                text(f'ALTER TABLE {name} ALTER COLUMN "{column}" SET ({", ".join(options)})')
            )


def _sequence(conn: Connection, table: str, column: str) -> str:
    return str(
        conn.execute(
            text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table, "c": column}
        ).scalar_one()
    )
