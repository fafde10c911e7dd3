"""The pieces of a test's world that conftest.py builds and that tests and tests/support reuse:
the repository root, the test catalog and webhook secret, the services' addresses, one test's
isolated environment (TestEnv) and the resets that give a process no cached settings or engine.

conftest.py registers the fixtures; this module holds what test code imports (a test module
never imports conftest.py or another test module)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "tests" / "catalog.yaml"
ACTIVATION = ROOT / "catalog" / "examples" / "activation.yaml"  # the Slack and Teams tests'
# With CLARION_DATABASE_URL set, the public development secret is refused (clarion/settings.py).
WEBHOOK_SECRET = "clarion-test-secret"


@dataclass(frozen=True)
class Services:
    database_url: str
    redis_url: str
    broker_url: str


@dataclass(frozen=True)
class TestEnv:
    """One test's isolated world: its database and the CLARION_* variables that point at it."""

    database_url: str
    redis_url: str
    home: Path
    env: dict[str, str]


def with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def partitions_under_test() -> int | None:
    """TEST_CLARION_PARTITIONS=N: tests migrate to the layout hash-partitioned into N (db/partitioning.py)."""
    parts = os.environ.get("TEST_CLARION_PARTITIONS")
    return int(parts) if parts else None


def reset_process_state() -> None:
    from clarion import faults, settings
    from clarion.db import engine
    from clarion.tasks import runtime

    settings.reset()
    faults.reset()
    runtime.reset()
    engine.dispose_all()


def use_only(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> None:
    """Exactly these CLARION_* variables for this process and its children (any other is
    removed), and no settings, engine or catalog cached from before."""
    for key in [k for k in os.environ if k.startswith("CLARION_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    reset_process_state()
