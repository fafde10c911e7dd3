"""Every `pytest.raises(...)` in tests/ names the refusal it expects with `match=`.

Without it a test passes when the error comes from somewhere else (STYLE.md, "Traps"): a
`ClarionError` raised by an unknown channel satisfies a test about a bad shape. The check reads
each module's syntax tree, so the context-manager form, the call form and a call split over
several lines are all seen."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.syntax import parse

TESTS = Path(__file__).resolve().parents[1]


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if ".venv" not in p.parts)


def _is_raises(func: ast.expr) -> bool:
    """`pytest.raises` (or a bare `raises` imported from pytest)."""
    if isinstance(func, ast.Attribute):
        return (
            func.attr == "raises" and isinstance(func.value, ast.Name) and func.value.id == "pytest"
        )
    return isinstance(func, ast.Name) and func.id == "raises"


def unmatched(path: Path, source: str | None = None) -> list[str]:
    """`file:line` of every pytest.raises call in `path` (with `source`, else its text) that has
    no `match=` keyword."""
    return [
        f"{path.relative_to(TESTS.parent)}:{node.lineno}"
        for node in ast.walk(parse(path, source))
        if isinstance(node, ast.Call)
        and _is_raises(node.func)
        and not any(k.arg == "match" for k in node.keywords)
    ]


def test_there_are_raises_to_check():
    calls = [
        node
        for path in _modules()
        for node in ast.walk(parse(path))
        if isinstance(node, ast.Call) and _is_raises(node.func)
    ]
    assert len(calls) > 100  # the scan sees the suite's raises, not an empty folder


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(TESTS)))
def test_every_pytest_raises_has_a_match(path):
    assert unmatched(path) == []


@pytest.mark.parametrize(
    "source",
    [
        "import pytest\nwith pytest.raises(ValueError):\n    int('x')\n",
        "import pytest\npytest.raises(ValueError, int, 'x')\n",
        "from pytest import raises\nwith raises(ValueError):\n    int('x')\n",
        "import pytest\nwith pytest.raises(\n    ValueError,\n):\n    int('x')\n",
        "import pytest\ndef t():\n    with open('f'), pytest.raises(KeyError):\n        pass\n",
    ],
)
def test_the_check_finds_a_raises_without_match(source):
    """The check itself can fail: each form without `match=` is caught once."""
    probe = TESTS / "unit" / "test_raises_probe.py"
    assert len(unmatched(probe, source)) == 1


def test_the_check_lets_a_match_through():
    probe = TESTS / "unit" / "test_raises_probe.py"
    source = (
        "import pytest\nwith pytest.raises(ValueError, match='invalid literal'):\n    int('x')\n"
        "with pytest.raises(\n    KeyError,\n    match='a',\n):\n    {}['a']\n"
    )
    assert unmatched(probe, source) == []
