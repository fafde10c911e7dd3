"""requests_pin_locale runs only for a row that names no locale: a statement that gives one (the
series tick, which has its recipients at hand) pays no per-row trigger call.

The trigger's function is unchanged (it already kept a locale given); the WHEN clause is evaluated
by PostgreSQL itself, so a row with a locale never enters PL/pgSQL. Measured on the beat tick
(bench/tick.py, 1,000 series): about 3 ms of the server's ~30 ms per tick.

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"

UPGRADE = """
DROP TRIGGER IF EXISTS requests_pin_locale ON requests;
CREATE TRIGGER requests_pin_locale BEFORE INSERT ON requests
    FOR EACH ROW WHEN (NEW.locale IS NULL) EXECUTE FUNCTION requests_pin_locale();
"""

DOWNGRADE = """
DROP TRIGGER IF EXISTS requests_pin_locale ON requests;
CREATE TRIGGER requests_pin_locale BEFORE INSERT ON requests
    FOR EACH ROW EXECUTE FUNCTION requests_pin_locale();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
