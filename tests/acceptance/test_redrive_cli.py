"""`clarion redrive` as ops run it: a real subprocess against this test's database, asserted on its
output, its exit code and the rows. The failed deliveries are made in this process through the real
pipeline (tests/support/redrive.py has the scenario)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import ok, refused
from tests.support.pipeline import counts, rows
from tests.support.redrive import delivery, failed_in_a_rolling_deploy, receiver

pytestmark = pytest.mark.acceptance
__all__ = ["receiver"]  # a fixture, from tests/support/redrive.py

CLARION = Path(sys.executable).parent / "clarion"


@pytest.fixture
def clarion(receiver, clarion_env):
    env = {**os.environ, **clarion_env.env}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(CLARION), *args], env=env, capture_output=True, text=True, timeout=120
        )

    return run


def test_redrive_dry_run_then_for_real(clarion, monkeypatch, tmp_path):
    keys = [failed_in_a_rolling_deploy(monkeypatch, tmp_path, user) for user in ("ann", "bo")]
    before = counts()
    out = ok(clarion("redrive", "--reason", "template_missing", "--since", "1h", "--dry-run"))
    assert out.startswith("2 deliveries would be re-queued (dry run: nothing changed)"), out
    assert "receipt  template_missing  failed      2" in out, out
    assert counts() == before and {delivery(k)["state"] for k in keys} == {"failed"}

    assert ok(clarion("redrive", "--type", "nudge")).startswith("0 deliveries re-queued")
    out = ok(clarion("redrive", "--type", "receipt", "--state", "failed", "--limit", "1"))
    assert out.startswith("1 deliveries re-queued; --limit 1 reached, run again for more"), out
    assert [delivery(k)["state"] for k in keys] == ["pending", "failed"]
    assert ok(clarion("redrive")).startswith("1 deliveries re-queued")
    assert [delivery(k)["state"] for k in keys] == ["pending", "pending"]
    assert len(rows("SELECT 1 FROM decisions WHERE gate = 'redrive'")) == 2


@pytest.mark.parametrize(
    "args",
    [
        ["--limit", "0"],
        ["--since", "yesterday"],
        ["--until", "2026-12-01T00:00"],
        ["--state", "sent"],
    ],
)
def test_bad_redrive_calls_are_refused_with_one_line(clarion, args):
    result = clarion("redrive", *args)
    if args[0] == "--state":  # argparse's own refusal
        assert result.returncode == 2 and "invalid choice" in result.stderr
        return
    refused(result)
