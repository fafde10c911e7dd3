"""The tests' own layout: a test module never imports another test module or conftest.py.

What several modules share lives in tests/support (fixtures included, imported by the modules
that use them). Importing a test module instead runs its collection-time code a second time,
binds a test to another module's private helpers, and hides a fixture's origin. Imports inside
functions count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.syntax import parse

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "acceptance")


def _test_modules() -> list[Path]:
    return sorted(p for tier in TIERS for p in (TESTS / tier).glob("test_*.py"))


def _checked_modules() -> list[Path]:
    """Test modules, and tests/support (which test modules import, so it must not close the loop)."""
    return _test_modules() + sorted((TESTS / "support").glob("*.py"))


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


FORBIDDEN = {_dotted(p) for p in _test_modules()} | {"tests.conftest"}


def _imported(path: Path, source: str) -> list[tuple[int, str]]:
    """(line, dotted name) for every module a file imports, relative imports resolved; for
    `from package import name` both the package and package.name."""
    package = _dotted(path).rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(parse(path, source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def offences(path: Path, source: str | None = None) -> list[str]:
    """What `path` (with `source`, else its text) imports that it must not."""
    source = path.read_text() if source is None else source
    return [
        f"{path.relative_to(TESTS.parent)}:{line} imports {name}"
        for line, name in _imported(path, source)
        if name in FORBIDDEN and name != _dotted(path)
    ]


def test_the_tiers_have_test_modules_to_check():
    assert {p.parent.name for p in _test_modules()} == set(TIERS)
    assert "tests.integration.test_api" in FORBIDDEN and "tests.conftest" in FORBIDDEN


@pytest.mark.parametrize("path", _checked_modules(), ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_module_imports_another_test_module_or_conftest(path):
    assert offences(path) == []


@pytest.mark.parametrize(
    "source",
    [
        "from tests.integration.test_api import client",
        "from tests.integration import test_slack as slack_tests",
        "import tests.unit.test_gate_pipeline",
        "from .test_inbox import items",
        "from . import test_inbox",
        "from tests.conftest import ROOT",
        "def f():\n    from tests.acceptance.test_cli import ok\n",
    ],
)
def test_the_check_finds_each_way_of_importing_a_test_module(source):
    """The check itself can fail: a module in tests/integration with each form is caught."""
    probe = TESTS / "integration" / "test_layout_probe.py"
    assert len(offences(probe, source)) == 1, offences(probe, source)


def test_the_check_lets_support_imports_through():
    probe = TESTS / "integration" / "test_layout_probe.py"
    source = "from tests.support.api import client\nfrom tests.support import summarisers\n"
    assert offences(probe, source) == []
