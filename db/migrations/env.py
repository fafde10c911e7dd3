"""Alembic environment: runs migrations on the connection handed in by db.migrate()."""

from alembic import context

from clarion.db.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata)
with context.begin_transaction():
    context.run_migrations()
