"""Parsing the project's own source for the tests that read it as a syntax tree.

CPython 3.11 keeps one AST-conversion depth counter per interpreter, so a parse that starts
inside another parse's conversion breaks the outer one with `SystemError: AST constructor
recursion depth mismatch` (python/cpython#106905). A garbage collection landing in the conversion
runs finalizers, and one that logs an error (an asyncio task destroyed while pending, whose log
write fails on pytest's closed capture stream) prints a traceback, which 3.11 places carets on by
parsing the source line: a nested parse. Holding the collector off for the parse keeps other
tests' garbage out of it: what is garbage now is collected after the parse, outside it. (A
collection before each parse as well cost the tests that read every source file ~100 s each.)"""

from __future__ import annotations

import ast
import gc
from pathlib import Path


def parse(path: Path, source: str | None = None) -> ast.Module:
    """The syntax tree of `path` (or of `source`, named `path` in a SyntaxError)."""
    text = path.read_text(encoding="utf-8") if source is None else source
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(text, filename=str(path))
    finally:
        if was_enabled:
            gc.enable()
