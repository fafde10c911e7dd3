"""Which way imports point, checked by import-linter with the contracts in pyproject.toml
([tool.importlinter]): the tree keeps them, and each rule the contracts state is shown to break when
one import against it is added — inside a function, where imports hide — to a copy of the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"
LAYERS = "clarion's layers"
CYCLES = "no import cycles between packages"


def lint(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)  # ahead of the editable install's finder
    return subprocess.run(
        [str(LINT), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_tree_keeps_every_contract():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and result.stdout.count(" KEPT") == 4


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the installed package with the card's folders as real directories."""
    top = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "clarion", top / "clarion", ignore=shutil.ignore_patterns("__pycache__"))
    assert not (top / "clarion" / "db").is_symlink()
    return top


@pytest.fixture
def edit(tree: Path) -> Iterator[Callable[[str, str], None]]:
    """Add a function importing `imported` to module `importer` of the copy; undone afterwards."""
    changed: dict[Path, str] = {}

    def add(importer: str, imported: str) -> None:
        path = tree.joinpath(*importer.split(".")).with_suffix(".py")
        changed.setdefault(path, path.read_text())
        path.write_text(
            changed[path] + f"\n\ndef _against_the_grain():\n    import {imported}  # noqa\n"
        )

    yield add
    for path, text in changed.items():
        path.write_text(text)


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        *(
            ("clarion.db.ledger", f"clarion.{up}.{m}")
            for up, m in [
                ("adapters", "base"),
                ("tasks", "route"),
                ("gates", "pipeline"),
                ("web", "app"),
                ("ops", "cli"),
            ]
        ),
        ("clarion.adapters.webhook", "clarion.db.ledger"),
        ("clarion.adapters.webhook", "clarion.tasks.route"),
        ("clarion.gates.quiet", "clarion.tasks.route"),
        ("clarion.gates.quiet", "clarion.adapters.webhook"),
        ("clarion.catalog.locales", "clarion.db.ledger"),
        ("clarion.catalog.locales", "clarion.scheduling.zones"),
        ("clarion.scheduling.zones", "clarion.records"),
        ("clarion.records", "clarion.db.ledger"),
        ("clarion.errors", "clarion.catalog.locales"),
        ("clarion.settings", "clarion.db.engine"),
        ("clarion.clock", "clarion.tasks.app"),
        ("clarion.web.app", "clarion.standins.receiver"),
        ("clarion.tasks.deliver", "clarion.standins.fake_slack"),
    ],
)
def test_an_import_against_the_grain_breaks_a_contract(tree, edit, importer, imported):
    edit(importer, imported)
    result = lint(tree, pythonpath=tree)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert f"{importer} -> {imported}" in result.stdout, result.stdout


def test_a_cycle_between_packages_breaks_the_cycle_contract(tree, edit):
    """tasks already imports db; db importing tasks closes a cycle."""
    edit("clarion.db.ledger", "clarion.tasks.route")
    result = lint(tree, pythonpath=tree)
    assert result.returncode == 1
    assert f"{CYCLES} BROKEN" in result.stdout, result.stdout
    assert "- .db -> .tasks" in result.stdout.split(f"{CYCLES}\n")[-1], result.stdout
