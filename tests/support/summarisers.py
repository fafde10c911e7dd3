"""Summarisers that misbehave on purpose, named by tests/catalog_digests.yaml."""

from __future__ import annotations

import threading

from clarion.tasks.summarise import SummaryRequest

RELEASE = threading.Event()  # a stalled summariser waits on this (the test sets it at the end)


def stall(request: SummaryRequest) -> str:
    RELEASE.wait(30)
    return "too late"


def explode(request: SummaryRequest) -> str:
    raise RuntimeError("the model is down")


def junk(request: SummaryRequest) -> object:
    kind = request.items[0].get("kind") if request.items else None
    return {
        "long": "x" * 500,
        "empty": "   ",
        "bytes": b"a line",
        "none": None,
        "lines": "one\ntwo",
        "good": "Two notes about builds",
    }[str(kind)]
