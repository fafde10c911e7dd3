"""Helpers for the digest tests: the digest catalog, and what a digest request carried."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.environment import ROOT, reset_process_state
from tests.support.gates import rows

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
