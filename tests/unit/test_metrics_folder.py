"""clarion's metrics count in the host's folder whatever imported prometheus_client first.

Each case runs in a fresh interpreter, as a process started by the `celery` command does: Celery's
entry point loads Flower's CLI plugin, which imports prometheus_client (private values) before any
clarion module; no PROMETHEUS_MULTIPROC_DIR is set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.multiprocess import MultiProcessCollector

CELERY_FIRST = """
import celery.bin.celery, sys
assert "prometheus_client" in sys.modules  # Flower's plugin came first
from clarion import metrics
metrics.SENDS.labels("transactional", "webhook", "sent").inc(3)
metrics.TICK_SECONDS.observe(0.02)
metrics.check()
"""

# A regression: clarion's metrics created while prometheus_client's value class is private.
PRIVATE = """
import celery.bin.celery
from clarion import metrics
metrics.setup()
from prometheus_client import values
values.ValueClass = values.MutexValue
try:
    metrics.check()
except metrics.ConfigurationError as exc:
    print(exc)
else:
    raise SystemExit("check() passed")
"""


def run(code: str, home: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLARION_", "PROMETHEUS_"))}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "CLARION_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_counts_land_in_the_home_folder_after_celery_imported_prometheus_client(tmp_path):
    run(CELERY_FIRST, tmp_path)
    folder = tmp_path / "metrics"
    samples = {
        (s.name, s.labels.get("outcome")): s.value
        for family in MultiProcessCollector.merge([str(p) for p in folder.glob("*.db")])
        for s in family.samples
    }
    assert samples[("clarion_sends_total", "sent")] == 3
    assert samples[("clarion_tick_seconds_count", None)] == 1


def test_the_start_check_refuses_metrics_that_count_in_private_memory(tmp_path):
    said = run(PRIVATE, tmp_path)
    assert "count in process-private memory" in said
    assert "TICK_SECONDS" in said
