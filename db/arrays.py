"""Array parameters written at C speed.

The ledger's statements take their rows as arrays (`unnest(CAST(:users AS text[]), …)`), a
hundred elements or more per parameter. psycopg's text `ListDumper` writes an array element by
element in Python (a dumper call, a regular-expression test and perhaps an escape for each): a
fifth of the route task's own CPU. `FlatListDumper` writes the flat lists those statements pass —
every element a `str`, every element an `int`, every element a `bool`, or every element a
timezone-aware `datetime`, with None (NULL) allowed among any of them — with one `join`, and hands
anything else (nested lists, naive datetimes, mixed types) to psycopg's own. A flat list is sent
as an array of unknown type: the statement's cast (`CAST(:ids AS bigint[])`) or the column or
operand it meets gives it its type.

Each string element is quoted, with `"` and `\\` escaped (PostgreSQL's array input: a quoted
element is taken as it is written, whitespace, commas, braces and the word NULL included). Text
cannot hold NUL in PostgreSQL: refused as psycopg refuses it. `True`/`False` are boolean input
PostgreSQL accepts in any case. Registered on clarion's own connections only (db/engine.py), never
on psycopg's global adapters: a host app's connections keep psycopg's behaviour.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import errors
from psycopg.abc import Buffer, DumperKey
from psycopg.adapt import PyFormat
from psycopg.types.array import BaseListDumper, ListDumper

_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"'})
_NONE = type(None)


def _flat_kind(obj: list[Any]) -> tuple[type | None, bool] | None:
    """The one element type of a list FlatListDumper writes itself (None: nothing but NULLs),
    and whether NULLs are among them; None for a list psycopg's ListDumper writes."""
    kinds = set(map(type, obj))
    nulls = _NONE in kinds
    kinds.discard(_NONE)
    if not kinds:
        return None, nulls
    if len(kinds) > 1:
        return None
    kind = kinds.pop()
    if kind in (str, int, bool):
        return kind, nulls
    if kind is datetime and all(v is None or v.tzinfo is not None for v in obj):
        return kind, nulls
    return None


class FlatListDumper(ListDumper):
    # psycopg looks at a list's elements twice before dumping it (get_key, then upgrade: which
    # array type, from the first element, the smallest int type that holds them all), on every
    # execute (its dumper cache is per cursor). A flat list is sent as an array of unknown type
    # instead, and PostgreSQL reads it as the type the statement casts it to (every array
    # parameter of ours is cast: `CAST(:ids AS bigint[])`), or the column or operand it meets.
    def get_key(self, obj: list[Any], format: PyFormat) -> DumperKey:
        return self.cls if _flat_kind(obj) is not None else super().get_key(obj, format)

    def upgrade(self, obj: list[Any], format: PyFormat) -> BaseListDumper:
        return self if _flat_kind(obj) is not None else super().upgrade(obj, format)

    def dump(self, obj: list[Any]) -> Buffer | None:
        flat = _flat_kind(obj)
        if flat is None:
            return super().dump(obj)
        kind, nulls = flat
        if kind is str:
            texts = [s for s in obj if s is not None] if nulls else obj
            whole = "".join(texts)
            if "\x00" in whole:
                raise errors.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
            if '"' in whole or "\\" in whole:
                obj = [s if s is None else s.translate(_ESCAPES) for s in obj]
            return self._quoted(obj, nulls).encode(self._text_encoding())
        if kind is datetime:
            # as psycopg writes one (str(): ISO 8601 with its offset), quoted for its space
            return self._quoted([v if v is None else str(v) for v in obj], nulls).encode()
        # int, bool, or nothing but NULLs
        words = [("NULL" if v is None else str(v)) for v in obj] if nulls else map(str, obj)
        return ("{" + ",".join(words) + "}").encode()

    @staticmethod
    def _quoted(texts: list[Any], nulls: bool) -> str:
        """`{"a","b"}`; None as NULL, unquoted (quoted, "NULL" is the text NULL)."""
        if not nulls:
            return '{"' + '","'.join(texts) + '"}'
        return "{" + ",".join("NULL" if t is None else '"' + t + '"' for t in texts) + "}"

    def _text_encoding(self) -> str:
        encoding = self._tx.encoding
        return "utf-8" if encoding == "ascii" else encoding  # as psycopg's own StrDumper


def register(connection: Any) -> None:
    """Dump lists with FlatListDumper on this psycopg connection."""
    connection.adapters.register_dumper(list, FlatListDumper)
