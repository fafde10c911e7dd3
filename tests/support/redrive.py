"""The redrive tests' scenario, shared by tests/integration/test_redrive.py and
tests/acceptance/test_redrive_cli.py: the `receiver` fixture (a webhook receiver and the
recipients ann and bo) and a delivery that failed in a rolling deploy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from clarion import settings
from clarion.errors import FaultInjected
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from tests.support.environment import CATALOG
from tests.support.pipeline import configure, drain, expire_lease, rows

Key = tuple[str, int]


@pytest.fixture
def receiver(clarion_env, monkeypatch) -> Iterator[Receiver]:
    with Receiver(settings.get().webhook_secret) as running:
        configure(monkeypatch, webhook_url=running.url)
        register_recipient("ann", timezone="UTC")
        register_recipient("bo", timezone="UTC")
        yield running


def old_worker_catalog(tmp_path: Path) -> Path:
    """The test catalog as a worker one release behind has it: receipt v1 only, no nudge type."""
    data = yaml.safe_load(CATALOG.read_text())
    del data["types"]["nudge"]
    data["types"]["receipt"]["templates"] = [
        t for t in data["types"]["receipt"]["templates"] if t["version"] == 1
    ]
    path = tmp_path / "old-catalog.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def failed_in_a_rolling_deploy(
    monkeypatch,
    tmp_path: Path,
    user: str = "ann",
    type_key: str = "receipt",
    variables: dict | None = None,
) -> Key:
    """A request pinned by a newer producer, delivered by an older worker past the skew grace:
    fails template_missing.

    The worker that routes a request sends it (in the same process), so a type the older worker
    has is routed and sent by it. One it lacks altogether it would route as `unknown_type`, with
    no delivery: that request is routed by a newer worker that stops right after its commit
    (before its send), and the older worker's deliver task takes the row over once the claim's
    lease has run out."""
    request = notify(
        user, type_key, event_id=f"e-{user}-{type_key}", variables=variables or {"order": "A-1"}
    )
    old = old_worker_catalog(tmp_path)
    known_to_old = type_key in yaml.safe_load(old.read_text())["types"]
    if known_to_old:
        configure(monkeypatch, catalog=old, catalog_skew_grace=0.001)
        assert route([user], [request.request_id]) == 1
    else:
        configure(monkeypatch, faults="route.after_commit=raise*1")
        with pytest.raises(FaultInjected, match=r"^route\.after_commit$"):
            route([user], [request.request_id])
    [row] = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=request.request_id)
    key = (row["user_id"], row["id"])
    if not known_to_old:
        expire_lease(key)
        configure(monkeypatch, faults=None, catalog=old, catalog_skew_grace=0.001)
        assert deliver([key[0]], [key[1]]) == 0
    configure(
        monkeypatch, catalog=CATALOG, catalog_skew_grace=None
    )  # the deploy finished: all have v2
    drain("transactional")
    drain("activation")
    return key


def delivery(key: Key) -> dict:
    [row] = rows("SELECT * FROM deliveries WHERE user_id = :u AND id = :i", u=key[0], i=key[1])
    return row
