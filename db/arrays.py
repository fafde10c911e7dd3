"""Array parameters written at C speed.

The ledger's statements take their rows as arrays (`unnest(CAST(:users AS text[]), …)`), a
hundred elements or more per parameter. psycopg's text `ListDumper` writes an array element by
element in Python (a dumper call, a regular-expression test and perhaps an escape for each): a
fifth of the route task's own CPU. `FlatListDumper` writes the flat lists those statements pass —
every element a `str`, every element an `int`, or every element a `bool` — with one `join`, and
hands anything else (None among the elements, nested lists, dates, mixed types) to psycopg's own.

Each string element is quoted, with `"` and `\\` escaped (PostgreSQL's array input: a quoted
element is taken as it is written, whitespace, commas, braces and the word NULL included). Text
cannot hold NUL in PostgreSQL: refused as psycopg refuses it. `True`/`False` are boolean input
PostgreSQL accepts in any case. Registered on clarion's own connections only (db/engine.py), never
on psycopg's global adapters: a host app's connections keep psycopg's behaviour.
"""

from __future__ import annotations

from typing import Any

from psycopg import errors
from psycopg.abc import Buffer
from psycopg.types.array import ListDumper

_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"'})


class FlatListDumper(ListDumper):
    def dump(self, obj: list[Any]) -> Buffer | None:
        kinds = set(map(type, obj))
        if kinds == {str}:
            whole = "".join(obj)
            if "\x00" in whole:
                raise errors.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
            if '"' in whole or "\\" in whole:
                obj = [s.translate(_ESCAPES) for s in obj]
            return ('{"' + '","'.join(obj) + '"}').encode(self._text_encoding())
        if kinds == {int} or kinds == {bool}:
            return ("{" + ",".join(map(str, obj)) + "}").encode()
        return super().dump(obj)

    def _text_encoding(self) -> str:
        encoding = self._tx.encoding
        return "utf-8" if encoding == "ascii" else encoding  # as psycopg's own StrDumper


def register(connection: Any) -> None:
    """Dump lists with FlatListDumper on this psycopg connection."""
    connection.adapters.register_dumper(list, FlatListDumper)
