"""`clarion demo`, as a newcomer runs it (`make demo`): a real subprocess on its own embedded
PostgreSQL and Redis, asserted on the tables it prints. In the soak tier (CI runs it once): it
takes about a minute and starts its own services."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.acceptance, pytest.mark.soak]

CLARION = Path(sys.executable).parent / "clarion"


def _count(output: str, label: str) -> int:
    """The count column of the results-table row that starts with `label`."""
    found = re.search(rf"^{re.escape(label)}\s+(\d+)\s*$", output, re.MULTILINE)
    assert found, f"no row {label!r} in the demo's results table"
    return int(found.group(1))


def _chain(output: str, page: str) -> str:
    found = re.search(rf"^{re.escape(page)}\s+.*$", output, re.MULTILINE)
    assert found, f"no escalation row for {page}"
    return found.group(0)


def test_the_demo_shows_no_duplicate_a_digest_and_escalations(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    env["CLARION_HOME"] = str(tmp_path / "home")
    run = subprocess.run(
        [str(CLARION), "demo"], env=env, capture_output=True, text=True, timeout=600
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "Traceback" not in out

    # at most once: the receiver saw every sent webhook delivery once, under one key
    assert _count(out, "occurrences that arrived under two different keys") == 0
    assert _count(out, "  sent on webhook") == _count(
        out, "webhook receiver: distinct idempotency keys"
    )
    assert _count(out, "  repeated events (returned the existing request)") == 150

    # the digest: 7 replies buffered into one message sent through the router
    assert _count(out, "digest: replies buffered (decision 'digested into request N')") == 7
    assert (
        _count(out, "digest: sent as one message: '3 sellers replied to you (7 new messages)'") == 1
    )

    # escalation: acked at once -> nothing more; no ack -> SMS then the secondary; a dead number
    # -> the secondary at once after the SMS failed
    acked, silent, dead = (_chain(out, p) for p in ("oncall-ana", "oncall-bo", "oncall-cy"))
    assert re.search(r"\s0\s+acked\s+stop/acked", acked), acked
    assert re.search(r"\s1\s+finished\s+escalate/no_ack .*escalate/no_ack", silent), silent
    assert "hurry/step_failed" in dead and "finished" in dead, dead
    assert "the secondary's webhook got 2 page(s)" in out
