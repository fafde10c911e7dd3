"""Plans that do not depend on when ANALYZE last ran (issue 29): statistics settings for the
tables that grow with every notification.

- user_id's n_distinct is pinned at -0.01 (a hundredth of the rows: a recipient has ~100 rows)
  on the per-recipient history tables. Analyzed while small, the planner reads "one row per
  recipient" and, until ANALYZE runs again, takes any index that leads with user_id as good as
  the primary key: mark_sent_many's generic plan probed deliveries_one_send by user_id alone and
  read every sent row of each recipient per key (bench/history.py). A negative n_distinct scales
  with the table's size as the planner estimates it now (pages × density), not as it was when
  analyzed; ANALYZE keeps the pinned value.
- autovacuum analyzes these tables after 2% of their rows changed (PostgreSQL's default is 10%:
  2 M changed rows at 20 M) and vacuums after 5% (inserts included), so the statistics and the
  visibility map keep up with a ledger of tens of millions of rows.

The tables are analyzed at the end, so the pinned n_distinct is in the statistics at once.
In the hash-partitioned layout (db/partitioning.py) the partitions are new tables: the rebuild
carries these settings onto each partition; a database partitioned before this revision gets
them on the parents only (n_distinct; a partitioned parent takes no autovacuum settings).

Revision ID: 0027
Revises: 0026
"""

from alembic import op

revision = "0027"
down_revision = "0026"

TABLES = ("requests", "deliveries", "receipts", "decisions", "inbox_items", "incidents")
AUTOVACUUM = (
    "autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_scale_factor = 0.05, "
    "autovacuum_vacuum_insert_scale_factor = 0.05"
)
RESET = (
    "autovacuum_analyze_scale_factor, autovacuum_vacuum_scale_factor, "
    "autovacuum_vacuum_insert_scale_factor"
)


def _is_partitioned(table: str) -> bool:
    kind = (
        op.get_bind()
        .exec_driver_sql(f"SELECT relkind FROM pg_class WHERE oid = to_regclass('{table}')")
        .scalar()
    )
    return kind == "p"


def upgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN user_id SET (n_distinct = -0.01)")
        if not _is_partitioned(table):  # a partitioned parent takes no autovacuum settings
            op.execute(f"ALTER TABLE {table} SET ({AUTOVACUUM})")
    op.execute(f"ANALYZE {', '.join(TABLES)}")


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN user_id RESET (n_distinct)")
        if not _is_partitioned(table):
            op.execute(f"ALTER TABLE {table} RESET ({RESET})")
