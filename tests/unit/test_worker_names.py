"""`clarion worker` gives every worker process its own Celery node name (Flower, inspect, and
Celery's own duplicate-node warnings key on it), unless the operator names it."""

from __future__ import annotations

import os

from clarion.ops.cli import parser, worker_command


def node(argv: list[str]) -> str:
    command = worker_command(parser().parse_args(["worker", *argv]))
    return command[command.index("-n") + 1]


def test_the_default_name_carries_the_lanes_and_the_process_id():
    assert node(["--lane", "activation"]) == f"activation-{os.getpid()}@%h"
    assert node([]) == f"transactional-activation-control-events-{os.getpid()}@%h"


def test_two_supervisors_on_one_host_get_two_names(monkeypatch):
    monkeypatch.setattr(os, "getpid", lambda: 101)
    first = node(["--lane", "activation"])
    monkeypatch.setattr(os, "getpid", lambda: 102)
    assert node(["--lane", "activation"]) != first


def test_an_explicit_name_wins_and_may_name_the_host():
    assert node(["--name", "nudges-1"]) == "nudges-1@%h"
    assert node(["--name", "nudges-1@box-7"]) == "nudges-1@box-7"
