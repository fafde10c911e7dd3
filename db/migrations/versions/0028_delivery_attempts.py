"""Every attempt of a delivery and its outcome (issue 25: "deliveries per channel with every
attempt and outcome"), and the indexes the activity page's search needs without a user id.

- delivery_attempts: one row per settled attempt, written by the statement that settles it
  (db/claims.py: sent, retrying, unknown, held, failed, exhausted), in its transaction: a row
  exists exactly when the delivery's own change committed. A throttle that gives the claim back
  unattempted (its attempt refunded) writes none. Keyed like its neighbours (user_id first, so it
  is hash-partitioned with them: db/partitioning.py) and read per request (the timeline).
  Retention removes the rows with their request's deliveries; erasure clears `error`.
- requests_id, requests_occurrence: `/activity` found a request by id, or by the app's event id,
  without its user id by reading `requests` whole (its keys lead with user_id). One probe each now.
  Each costs every request insert one more index entry (requests_id a right-most append).

Revision ID: 0028
Revises: 0027
"""

from alembic import op

revision = "0028"
down_revision = "0027"

OUTCOMES = ("sent", "retrying", "unknown", "held", "failed", "exhausted")

TABLE = f"""
CREATE TABLE delivery_attempts (
    user_id text NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    request_id bigint NOT NULL,
    delivery_id bigint NOT NULL,
    attempt integer NOT NULL,
    outcome text NOT NULL,
    platform text,
    error text NOT NULL DEFAULT '',
    at timestamp with time zone NOT NULL,
    CONSTRAINT delivery_attempts_pkey PRIMARY KEY (user_id, id),
    CONSTRAINT delivery_attempts_outcome_check
        CHECK (outcome IN ({", ".join(repr(o) for o in OUTCOMES)}))
);
CREATE INDEX delivery_attempts_request ON delivery_attempts (user_id, request_id);
ALTER TABLE delivery_attempts ALTER COLUMN user_id SET (n_distinct = -0.01);
CREATE INDEX requests_id ON requests (id);
CREATE INDEX requests_occurrence ON requests (occurrence_key);
"""


def upgrade() -> None:
    op.execute(TABLE)


def downgrade() -> None:
    op.execute(
        "DROP INDEX requests_occurrence; DROP INDEX requests_id; DROP TABLE delivery_attempts"
    )
