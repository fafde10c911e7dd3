"""Helpers for the digest tests: the digest catalog, and what a digest request carried."""

from __future__ import annotations

from typing import Any

import pytest

from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from clarion.tasks.tick import tick
from tests.support.environment import ROOT, reset_process_state
from tests.support.gates import rows
from tests.support.pipeline import drain

DIGESTS = ROOT / "tests" / "catalog_digests.yaml"


def use_digest_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Point this process (and the children it starts with os.environ) at the digest catalog."""
    monkeypatch.setenv("CLARION_CATALOG", str(DIGESTS))
    reset_process_state()


def digest_requests(user_id: str, type_key: str = "replies_digest") -> list[dict[str, Any]]:
    """(id, state, due_at, variables) of the recipient's digest requests, oldest first."""
    return [
        dict(zip(("id", "state", "due_at", "variables"), r, strict=True))
        for r in rows(
            "SELECT id, state, due_at, variables FROM requests "
            "WHERE user_id = :u AND type_key = :t ORDER BY id",
            u=user_id,
            t=type_key,
        )
    ]


def digested_into(user_id: str, request_id: int) -> int | None:
    """The digest request id a buffered request's decision names."""
    found = rows(
        "SELECT detail FROM decisions WHERE user_id = :u AND request_id = :r AND gate = 'digest'",
        u=user_id,
        r=request_id,
    )
    if not found:
        return None
    [(detail,)] = found
    return int(detail.split("digested into request ")[1].split()[0])


def flush_due() -> list[int]:
    """What the beat tick does at the clock's time, then the route and deliver tasks it wakes."""
    tick()
    routed = [k for name, users, ids in drain("activation") for k in zip(users, ids, strict=True)]
    routed += [k for _, users, ids in drain("transactional") for k in zip(users, ids, strict=True)]
    if routed:
        route([u for u, _ in routed], [i for _, i in routed])
    pending = rows("SELECT user_id, id FROM deliveries WHERE state = 'pending' ORDER BY id")
    if pending:
        deliver([u for u, _ in pending], [i for _, i in pending])
    digests = {i for (i,) in rows("SELECT id FROM requests WHERE occurrence_key LIKE 'digest:%'")}
    return [i for _, i in routed if i in digests]  # not the items' own (already routed) messages
