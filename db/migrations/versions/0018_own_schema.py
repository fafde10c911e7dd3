"""clarion in its own schema: the trigger function finds clarion's tables whatever the caller's
search_path.

From this revision every clarion object lives in the schema CLARION_SCHEMA (`clarion`), with the
Alembic version in `<schema>.alembic_version`; db.migrate() creates the schema, runs the migrations
with it as the search_path, and moves a deployment still in `public` there first (db/relocate.py).
What remains for a revision is the one function: requests_pin_locale() reads `recipients`
unqualified, and a trigger runs with the search_path of the session that inserts (a host app's
connection, under notify(connection=...), has `public`, where a host's own `recipients` may be).
`SET search_path FROM CURRENT` pins the schema the migration runs in. Its cost, measured on this
machine (embedded PostgreSQL, 6 alternating rounds of one INSERT … SELECT of 20,000 requests each
through the trigger): median 53.5 µs per row with it, 52.6 µs without — within the rounds' spread
(0.77–1.49 s per round).

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"


def upgrade() -> None:
    op.execute("ALTER FUNCTION requests_pin_locale() SET search_path FROM CURRENT")


def downgrade() -> None:
    op.execute("ALTER FUNCTION requests_pin_locale() RESET search_path")
