"""The running catalog is named (path and sha256) and follows its file without a restart
(tasks/catalogs.py): a look at most once per interval on an injected clock, a broken or
version-rewriting edit refused with the old catalog kept, the refusal logged once."""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import select
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from clarion import settings
from clarion.catalog.model import EXAMPLES
from clarion.errors import UnknownType
from clarion.tasks import catalogs, runtime
from clarion.tasks.producer import build_request

BASE: dict[str, Any] = {
    "types": {
        "receipt": {
            "category": "transactional",
            "channels": ["webhook"],
            "required": ["n"],
            "templates": [{"version": 1, "body": "v1 receipt {{ n }}"}],
        }
    }
}


class Ticks:
    """An injected monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, spec: dict[str, Any]) -> Path:
    """Write the catalog as an operator should: a new file renamed over the old one."""
    fresh = path.with_suffix(".new")
    fresh.write_text(yaml.safe_dump(spec, sort_keys=False))
    os.replace(fresh, path)
    return path


def edited(change) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    change(spec["types"])
    return spec


def add_v2_and_a_type(types: dict[str, Any]) -> None:
    types["receipt"]["templates"].append({"version": 2, "body": "v2 receipt {{ n }}"})
    types["welcome"] = {
        "category": "transactional",
        "channels": ["webhook"],
        "templates": [{"version": 1, "body": "hello"}],
    }


@pytest.fixture
def loaded(tmp_path) -> tuple[catalogs.Loaded, Path, Ticks]:
    path = write(tmp_path / "catalog.yaml", BASE)
    ticks = Ticks()
    return catalogs.Loaded(path, monotonic=ticks), path, ticks


def test_the_catalog_is_named_by_its_path_and_sha256(loaded) -> None:
    source, path, _ = loaded
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert source.catalog.digest == digest
    assert source.catalog.name == f"{path} (sha256 {digest[:12]})"


def test_a_change_is_seen_after_the_interval_or_at_once_when_asked(loaded) -> None:
    source, path, ticks = loaded
    first = source.current()
    write(path, edited(add_v2_and_a_type))
    ticks.now += 0.5
    assert source.current() is first  # not looked at yet: at most once a second
    ticks.now += 0.5
    now = source.current()
    assert now is not first and set(now.types) == {"receipt", "welcome"}
    assert now.get("receipt").version == 2 and now.digest != first.digest


def test_check_now_looks_at_once(loaded) -> None:
    source, path, _ = loaded
    write(path, edited(add_v2_and_a_type))
    assert source.current().get("welcome") is None  # the interval has not passed
    assert source.check_now().get("welcome") is not None


def test_a_broken_edit_keeps_the_old_catalog_and_says_why_once(loaded, caplog) -> None:
    source, path, ticks = loaded
    before = source.current()
    broken = edited(lambda t: t["receipt"]["templates"][0].update(body="{{ n | shout }}"))
    write(path, broken)
    with caplog.at_level(logging.ERROR, logger="clarion.tasks.catalogs"):
        for _ in range(3):
            ticks.now += 1
            source.check_now()
            path.touch()  # a new mtime, the same bytes: not refused again
    assert source.current() is before
    refusals = [r for r in caplog.records if getattr(r, "action", "") == "catalog_reload_refused"]
    assert len(refusals) == 1, caplog.text
    assert "unknown filter 'shout'" in refusals[0].getMessage()
    assert str(path) in refusals[0].getMessage()
    write(path, edited(add_v2_and_a_type))  # a good edit after it is taken
    assert set(source.check_now().types) == {"receipt", "welcome"}


def test_rewriting_a_version_in_place_is_refused(loaded, caplog) -> None:
    source, path, _ = loaded
    before = source.current()
    write(path, edited(lambda t: t["receipt"]["templates"][0].update(body="changed {{ n }}")))
    with caplog.at_level(logging.ERROR, logger="clarion.tasks.catalogs"):
        assert source.check_now() is before
    assert "rewrites template versions requests may be pinned to: receipt v1" in caplog.text
    assert before.get("receipt").render(1, "webhook", {"n": 7}) == {"body": "v1 receipt 7"}


def test_a_pinned_version_renders_as_pinned_after_the_file_moves_on(loaded) -> None:
    source, path, _ = loaded
    write(path, edited(add_v2_and_a_type))
    receipt = source.check_now().get("receipt")
    assert receipt.render(1, "webhook", {"n": 7}) == {"body": "v1 receipt 7"}
    assert receipt.render(2, "webhook", {"n": 7}) == {"body": "v2 receipt 7"}


@pytest.fixture
def configured(monkeypatch):
    def use(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("CLARION_CATALOG", raising=False)
        else:
            monkeypatch.setenv("CLARION_CATALOG", value)
        settings.reset()
        runtime.reset()

    yield use
    settings.reset()
    runtime.reset()


def test_unknown_type_names_the_catalog_file_and_digest(configured, tmp_path) -> None:
    path = write(tmp_path / "catalog.yaml", BASE)
    configured(str(path))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(
        UnknownType, match=r"^unknown notification type 'invoice_paid': not in catalog "
    ) as caught:
        build_request("ann", "invoice_paid", "e1", None, {})
    assert str(caught.value) == (
        f"unknown notification type 'invoice_paid': not in catalog {path} (sha256 {digest[:12]})"
    )


def test_the_demo_catalog_is_announced_with_a_warning(configured, caplog) -> None:
    configured(None)
    with caplog.at_level(logging.INFO, logger="clarion.tasks.catalogs"):
        catalog = runtime.catalog()
    assert catalog.source == str(EXAMPLES / "demo.yaml")
    [said] = [r for r in caplog.records if getattr(r, "action", "") == "catalog_loaded"]
    assert said.levelno == logging.WARNING and said.demo is True
    assert (
        "CLARION_CATALOG is not set" in said.getMessage()
        and catalog.digest[:12] in said.getMessage()
    )


def test_a_configured_catalog_is_announced_at_info(configured, tmp_path, caplog) -> None:
    path = write(tmp_path / "catalog.yaml", BASE)
    configured(str(path))
    with caplog.at_level(logging.INFO, logger="clarion.tasks.catalogs"):
        runtime.catalog()
    [said] = [r for r in caplog.records if getattr(r, "action", "") == "catalog_loaded"]
    assert said.levelno == logging.INFO and said.path == str(path) and said.types == 1


def test_an_idle_process_sees_an_edit_from_its_watch(tmp_path) -> None:
    """No task asks for the catalog here: the watch thread alone takes the edit."""
    path = write(tmp_path / "catalog.yaml", BASE)
    source = catalogs.Loaded(path, every=0.02)

    def watching() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "clarion-catalog-watch")

    before = watching()
    source.watch()
    source.watch()  # once per process
    assert watching() == before + 1
    write(path, edited(add_v2_and_a_type))
    deadline = time.monotonic() + 10
    while source.catalog.get("welcome") is None:
        assert time.monotonic() < deadline, "the watch did not take the edit"
        time.sleep(0.01)
    assert source.catalog.types["receipt"].version == 2
    del source  # the watch ends with its Loaded: it must not outlive this test (a thread still
    # logging when a later test forks this process leaves the child a lock it can never take)
    deadline = time.monotonic() + 10
    while watching() > before:
        assert time.monotonic() < deadline, "the watch outlived its Loaded"
        time.sleep(0.01)


def test_a_forked_pool_process_keeps_the_catalog_its_parent_checked(configured, tmp_path) -> None:
    """The file broke after the worker started: a pool process forked now runs the parent's
    catalog (it does not read the broken file as a first load, which would fail every task),
    refuses the edit itself, and does not inherit a lock held at the fork."""
    path = write(tmp_path / "catalog.yaml", BASE)
    configured(str(path))
    parent = runtime.catalog()
    write(path, edited(lambda t: t["receipt"]["templates"][0].update(body="{{ n | shout }}")))
    source = runtime.loaded()
    assert isinstance(source, catalogs.Loaded)
    reader, writer = os.pipe()
    with source._lock:  # another thread of the parent is in check_now() at the fork
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running pytest's teardown
            try:
                here = runtime.catalog_now()
                said = f"{here.digest} {sorted(here.types)}"
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                said = f"error {exc!r}"
            os.write(writer, said.encode())
            os._exit(0)
    os.close(writer)
    ready, _, _ = select.select([reader], [], [], 20)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    said = os.read(reader, 4096).decode() if ready else "the child hung"
    os.waitpid(pid, 0)
    os.close(reader)
    assert said == f"{parent.digest} ['receipt']", said
