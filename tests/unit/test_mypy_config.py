"""The core packages' mypy section is `mypy --strict`, flag for flag.

`strict = true` cannot be set per module, so pyproject.toml spells the flags out; a mypy upgrade
that adds one to --strict fails here until the section has it too."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from mypy.main import define_options

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
GLOBAL_ONLY = {"warn_redundant_casts", "warn_unused_ignores"}  # set for every module instead


def _config() -> dict[str, Any]:
    mypy: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["tool"]["mypy"]
    return mypy


def _override(module: str) -> dict[str, Any]:
    [section] = [o for o in _config()["overrides"] if module in o["module"]]
    return section


def test_the_core_section_sets_every_strict_flag() -> None:
    config, core = _config(), _override("clarion.db.*")
    for name, value in define_options()[2]:
        where = config if name in GLOBAL_ONLY else core
        assert where.get(name) == value, f"{name} = {value} is part of --strict"


def test_the_gates_are_core_and_nothing_is_let_off() -> None:
    """clarion.gates.* and clarion.db.gating are in the core section, no narrower section undoes
    a strict flag for them, and no module is let off its errors."""
    core = _override("clarion.db.*")
    assert "clarion.gates.*" in core["module"]
    strict = {name for name, _ in define_options()[2]} - GLOBAL_ONLY
    for section in _config()["overrides"]:
        if section != core:
            assert not strict & section.keys(), section["module"]
            assert not section.get("ignore_errors"), section["module"]
