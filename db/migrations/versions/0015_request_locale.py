"""requests.locale: the recipient's locale when the request was made, so that every attempt at
every channel of one request renders the same text, whatever the recipient changes later.

A BEFORE INSERT trigger fills it from the recipient row when the statement does not say (every
request insert, present and future — notify, series, the fatigue summary, digests — pins it
without naming it). Existing requests take their recipient's current locale.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"

UPGRADE = """
ALTER TABLE requests ADD COLUMN locale text;
UPDATE requests r SET locale = rc.locale FROM recipients rc WHERE rc.user_id = r.user_id;
CREATE FUNCTION requests_pin_locale() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.locale IS NULL THEN
        SELECT rc.locale INTO NEW.locale FROM recipients rc WHERE rc.user_id = NEW.user_id;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER requests_pin_locale BEFORE INSERT ON requests
    FOR EACH ROW EXECUTE FUNCTION requests_pin_locale();
"""

DOWNGRADE = """
DROP TRIGGER requests_pin_locale ON requests;
DROP FUNCTION requests_pin_locale();
ALTER TABLE requests DROP COLUMN locale;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
