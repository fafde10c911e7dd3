"""db.engine.normalise_url: what clarion makes of a CLARION_DATABASE_URL, without a database."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from clarion.db.engine import normalise_url


@pytest.mark.parametrize(
    ("given", "hosts", "ports"),
    [
        # libpq's multi-host form, as `pg_autoctl show uri` prints it
        (
            "postgresql://u@10.0.0.1:5432,10.0.0.2:5433/clarion?target_session_attrs=read-write",
            "10.0.0.1,10.0.0.2",
            "5432,5433",
        ),
        # SQLAlchemy's own form passes as it is
        ("postgresql://u@/clarion?host=h1:5432&host=h2:5432", "h1,h2", "5432,5432"),
        ("postgres://u:pw@db.example:6432/clarion", "db.example", 6432),
    ],
)
def test_every_host_of_a_url_reaches_the_driver(given: str, hosts: str, ports: object) -> None:
    url = normalise_url(given)
    assert url.startswith("postgresql+psycopg://")
    _, args = create_engine(url).dialect.create_connect_args(create_engine(url).url)
    assert (args["host"], args["port"], args["dbname"]) == (hosts, ports, "clarion")
    if "target_session_attrs" in given:
        assert args["target_session_attrs"] == "read-write"


def test_a_password_survives_the_multi_host_form() -> None:
    url = normalise_url("postgresql://u:s3cret@a:1,b:2/db")
    _, args = create_engine(url).dialect.create_connect_args(create_engine(url).url)
    assert (args["user"], args["password"], args["host"]) == ("u", "s3cret", "a,b")
