"""Alembic environment: runs migrations on the connection handed in by db.migrate(), whose
search_path is clarion's schema; the version table lives in that schema too (never the
`public.alembic_version` a host app's own Alembic history uses)."""

from alembic import context

from clarion.db.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table_schema=context.config.attributes["schema"],
)
with context.begin_transaction():
    context.run_migrations()
