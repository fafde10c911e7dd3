"""tests/support/syntax.py: a parse survives garbage whose finalizer parses too."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

from tests.support.syntax import parse

SOURCE = Path(__file__)


class _ParsesWhenCollected:
    """A cycle (only the collector frees it) whose finalizer parses, as traceback printing does."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        ast.parse("caret = (1 + 2)")


def test_a_finalizer_that_parses_does_not_break_the_parse():
    threshold = gc.get_threshold()
    gc.set_threshold(50)  # the collector runs often: inside the parse, unless held off
    try:
        for _ in range(30):
            garbage = [_ParsesWhenCollected() for _ in range(200)]
            del garbage
            tree = parse(SOURCE)
            assert any(isinstance(n, ast.ClassDef) for n in tree.body)
    finally:
        gc.set_threshold(*threshold)
        gc.collect()
