"""Recipients' custom attributes, segmentable in broadcasts (issue 28).

- recipients.attributes: the app's own fields about a recipient (`{"plan": "pro", "seats": 12}`),
  text, integer or boolean values, set through register_recipient(attributes=…) and
  `PUT /v1/users/{id}`. A broadcast's segment may filter on one (`attributes.plan`). Emptied by
  erasure like every other personal column.
- recipient_attribute_names: every attribute name ever set, so that a segment on a name no
  recipient has (a typo) is refused, naming the field, instead of silently reaching nobody (the
  rule topics follow: a topic exists once somebody joined it).

Revision ID: 0026
Revises: 0025
"""

from alembic import op

revision = "0026"
down_revision = "0025"

UPGRADE = """
ALTER TABLE recipients ADD COLUMN attributes jsonb NOT NULL DEFAULT '{}'::jsonb;
CREATE TABLE recipient_attribute_names (
    name        text NOT NULL,
    created_at  timestamptz NOT NULL,
    CONSTRAINT recipient_attribute_names_pkey PRIMARY KEY (name)
);
"""

DOWNGRADE = """
DROP TABLE recipient_attribute_names;
ALTER TABLE recipients DROP COLUMN attributes;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
