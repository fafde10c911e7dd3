"""/readyz against real dependencies made missing for real: a PostgreSQL port nobody listens on, a
database that does not exist, one never migrated, a Redis port nobody listens on, a catalog file
that does not parse, an address that never answers. Each is a 503 naming that dependency and
why (JSON, no traceback), answered within the checks' budget; /healthz is 200 throughout."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url
from starlette.testclient import TestClient

from clarion.web import asgi_app
from clarion.web.ready import CHECK_SECONDS
from tests.support.pipeline import configure

pytestmark = pytest.mark.integration

ALL = {"database", "schema", "broker", "catalog"}


@pytest.fixture
def client(clarion_env) -> Iterator[TestClient]:
    with TestClient(asgi_app()) as c:
        yield c


def closed_port() -> int:
    """A local port with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readiness(client: TestClient) -> tuple[int, dict, float]:
    started = time.monotonic()
    answer = client.get("/readyz")
    elapsed = time.monotonic() - started
    assert answer.headers["content-type"] == "application/json"
    assert client.get("/healthz").json() == {"status": "ok"}  # alive, whatever is missing
    return answer.status_code, answer.json(), elapsed


def failing(body: dict) -> dict[str, str]:
    return {name: c["reason"] for name, c in body["checks"].items() if not c["ok"]}


def test_ready_when_everything_is_there(client):
    status, body, _ = readiness(client)
    assert status == 200, body
    assert body == {"status": "ready", "checks": {name: {"ok": True} for name in ALL}}


def test_a_database_nobody_listens_on_is_a_503_naming_it(client, clarion_env, monkeypatch):
    url = make_url(clarion_env.database_url).set(host="127.0.0.1", port=closed_port())
    configure(monkeypatch, database_url=url.render_as_string(hide_password=False))
    status, body, elapsed = readiness(client)
    assert status == 503 and body["status"] == "not_ready"
    reasons = failing(body)
    assert set(reasons) == {"database", "schema"}
    assert "refused" in reasons["database"].lower() or "connect" in reasons["database"].lower()
    assert "Traceback" not in str(body) and elapsed < CHECK_SECONDS + 1


def test_a_database_that_does_not_exist_is_a_clean_503(client, clarion_env, monkeypatch):
    url = make_url(clarion_env.database_url).set(database="clarion_no_such_database")
    configure(monkeypatch, database_url=url.render_as_string(hide_password=False))
    status, body, _ = readiness(client)
    assert status == 503
    reasons = failing(body)
    assert set(reasons) == {"database", "schema"}
    assert 'database "clarion_no_such_database" does not exist' in reasons["database"]
    assert "\n" not in reasons["database"] and "Traceback" not in str(body)


def test_an_unmigrated_database_is_a_503_naming_the_schema(
    client, unmigrated_database, monkeypatch
):
    configure(monkeypatch, database_url=unmigrated_database)
    status, body, _ = readiness(client)
    assert status == 503
    reasons = failing(body)
    assert list(reasons) == ["schema"]  # the database itself answers
    assert reasons["schema"].startswith("not migrated") and "clarion migrate" in reasons["schema"]


def test_a_broker_nobody_listens_on_is_a_503_naming_it(client, monkeypatch):
    configure(monkeypatch, broker_url=f"redis://127.0.0.1:{closed_port()}/0")
    status, body, elapsed = readiness(client)
    assert status == 503
    reasons = failing(body)
    assert list(reasons) == ["broker"] and "refused" in reasons["broker"].lower()
    assert elapsed < CHECK_SECONDS + 1


def test_a_catalog_that_does_not_load_is_a_503_naming_it(client, tmp_path: Path, monkeypatch):
    broken = tmp_path / "catalog.yaml"
    broken.write_text("types: [unclosed\n")
    configure(monkeypatch, catalog=broken)
    status, body, _ = readiness(client)
    assert status == 503
    reasons = failing(body)
    assert list(reasons) == ["catalog"] and "catalog.yaml" in reasons["catalog"]


def test_a_dependency_that_never_answers_is_a_503_within_the_budget(client, monkeypatch):
    """A listener that accepts (the kernel's backlog) but never speaks: the checks' timeouts,
    not the client's patience, bound the answer."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        configure(
            monkeypatch,
            database_url=f"postgresql://u:p@127.0.0.1:{port}/db",
            broker_url=f"redis://127.0.0.1:{port}/0",
        )
        status, body, elapsed = readiness(client)
    assert status == 503
    assert set(failing(body)) == {"database", "schema", "broker"}
    assert elapsed < CHECK_SECONDS + 1, elapsed
