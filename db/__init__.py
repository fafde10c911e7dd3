"""The database: schema, migrations, named statements and the embedded PostgreSQL/Redis launcher."""
