"""An idle worker takes a catalog edit without a task (tasks/catalogs.py: each pool process, or
a solo/threads worker's main process, looks at the file every second), and a pool process keeps
the catalog its worker checked when the file breaks. Real worker processes, no task sent: the
only evidence is each process's own log line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from clarion.ops import launch
from tests.support.cluster import Cluster, children

pytestmark = pytest.mark.acceptance


def catalog(versions: int, extra: str | None = None) -> str:
    types = {
        "receipt": {
            "category": "transactional",
            "channels": ["webhook"],
            "templates": [{"version": v, "body": f"v{v} receipt"} for v in range(1, versions + 1)],
        }
    }
    if extra is not None:
        types["welcome"] = {
            "category": "transactional",
            "channels": ["webhook"],
            "templates": [{"version": 1, "body": extra}],
        }
    return yaml.safe_dump({"types": types})


def replace(path: Path, content: str) -> None:
    fresh = path.with_suffix(".new")
    fresh.write_text(content)
    os.replace(fresh, path)


def saying(log: Path, phrase: str) -> set[str]:
    """The processes (MainProcess, ForkPoolWorker-N) whose lines in `log` hold `phrase`."""
    return {
        line.split("/", 1)[1].split("]", 1)[0]
        for line in log.read_text(errors="replace").splitlines()
        if phrase in line and "/" in line
    }


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("pool", "processes"),
    [("prefork", {"ForkPoolWorker-1", "ForkPoolWorker-2"}), ("solo", {"MainProcess"})],
)
def test_an_idle_worker_takes_an_edit_and_keeps_it_through_a_broken_one(
    clarion_env, tmp_path, pool, processes
) -> None:
    path = tmp_path / "catalog.yaml"
    replace(path, catalog(1))
    logs = tmp_path / "logs"
    cluster = Cluster({**clarion_env.env, "CLARION_CATALOG": str(path)}, logs)
    command = launch.worker_command(
        ["control"], concurrency=2, name="w", pool=pool, loglevel="INFO"
    )
    try:
        cluster._start("w", command, {})
        cluster.wait_ready(["w"], 60)
        [log] = logs.glob("w.*.log")
        replace(path, catalog(2, extra="hello"))
        wait_for(lambda: saying(log, "catalog reloaded") == processes, 15, "every process reloads")
        replace(path, catalog(2, extra="{{ 'x' | shout }}"))
        wait_for(
            lambda: saying(log, "catalog change refused") == processes,
            15,
            "every process refuses the broken edit",
        )
        if pool == "prefork":  # a pool process started now inherits the good catalog
            for pid in children(cluster.processes["w"].pid):
                os.kill(pid, 9)
            wait_for(
                lambda: len(saying(log, "catalog change refused") - processes) == 2,
                30,
                "the replaced pool processes to refuse the file (not fail to load it)",
            )
    finally:
        cluster.stop()
    said = log.read_text(errors="replace")
    assert said.count("sha256") >= 1 and "Traceback" not in said, f"see {log}"
    assert "the catalog does not load" not in said, f"see {log}"
