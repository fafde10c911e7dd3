"""db/arrays.py on a real PostgreSQL: every list clarion's connections pass as an array parameter
reads back as the very list, through the fast path (flat lists of str, int, bool) and through
psycopg's own dumper for the rest, and text with NUL is refused as psycopg refuses it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import errors
from psycopg.adapt import PyFormat, Transformer
from sqlalchemy import text
from sqlalchemy.exc import DataError

from clarion.db.arrays import FlatListDumper
from clarion.db.engine import engine

pytestmark = pytest.mark.integration

# Every character PostgreSQL text can hold, the ones array input treats specially made likely.
TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(list('"\\{},; \t\n\r\x0b\x0cNULLnull\u3000\u2028\u00a0é😀')),
        st.characters(exclude_characters="\x00", codec="utf-8"),
    ),
    max_size=12,
)


def _round_trip(values: list[Any], sql_type: str) -> list[Any]:
    with engine().connect() as conn:
        return list(
            conn.execute(text(f"SELECT CAST(:v AS {sql_type})"), {"v": values}).scalar_one()
        )


def _dumped(values: list[Any]) -> bytes:
    """What clarion's connection writes for `values` (its dumper must be FlatListDumper)."""
    with engine().connect() as conn:
        driver = conn.connection.dbapi_connection
        assert isinstance(driver, psycopg.Connection)
        dumper = Transformer.from_context(driver).get_dumper(values, PyFormat.AUTO)
        assert isinstance(dumper, FlatListDumper)
        return bytes(dumper.dump(values) or b"")


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(TEXT, min_size=1, max_size=8))
def test_text_lists_read_back_as_written(clarion_env, values):
    assert _round_trip(values, "text[]") == values


@pytest.mark.parametrize(
    "values",
    [
        ["", "NULL", "null", " padded ", "a,b", "{x}", 'say "hi"', "back\\slash", "\\", '"'],
        ["é", "😀", "\u3000lead", "trail\u2028", "tab\there", "line\nbreak"],
    ],
    ids=["array-syntax", "unicode-and-space"],
)
def test_text_that_array_input_treats_specially(clarion_env, values):
    assert _round_trip(values, "text[]") == values
    assert _dumped(values).startswith(b'{"')  # the fast path wrote it


@pytest.mark.parametrize(
    ("values", "sql_type"),
    [
        ([0, -1, 2**62, -(2**62), 7], "bigint[]"),
        ([True, False, True], "boolean[]"),
        (["a", None, "b"], "text[]"),  # None among them: psycopg's own dumper
        ([1, None], "bigint[]"),
        ([], "text[]"),
        ([["a", "b"], ["c", "d"]], "text[]"),
    ],
    ids=["ints", "bools", "text-with-null", "int-with-null", "empty", "nested"],
)
def test_other_lists_read_back_as_written(clarion_env, values, sql_type):
    assert _round_trip(values, sql_type) == values


def test_text_with_nul_is_refused_as_psycopg_refuses_it(clarion_env):
    with pytest.raises(DataError, match="cannot contain NUL") as refused:
        _round_trip(["fine", "nul\x00here"], "text[]")
    assert isinstance(refused.value.orig, errors.DataError)
