"""db/arrays.py on a real PostgreSQL: every list clarion's connections pass as an array parameter
reads back as the very list, through the fast path (flat lists of str, int, bool or aware
datetimes, None among them) and through psycopg's own dumper for the rest, and text with NUL is
refused as psycopg refuses it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
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


# Aware datetimes anywhere in Python's range, at any offset PostgreSQL takes (to the second: an
# old zone's local mean time), microseconds or none.
AWARE = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.timezones()
) | st.builds(
    lambda at, seconds: at.replace(tzinfo=timezone(timedelta(seconds=seconds))),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.integers(min_value=-15 * 3600 + 1, max_value=15 * 3600 - 1),
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(st.one_of(AWARE, st.none()), min_size=1, max_size=8))
def test_aware_datetime_lists_read_back_as_the_same_instants(clarion_env, values):
    # compared in UTC: Python never finds two zones' datetimes equal when one of them falls in a
    # gap or fold of its zone (PEP 495), though both name the same instant
    utc = [None if v is None else v.astimezone(UTC) for v in values]
    assert [
        None if v is None else v.astimezone(UTC) for v in _round_trip(values, "timestamptz[]")
    ] == utc
    if any(v is not None for v in values):
        assert _dumped(values).startswith(b"{")


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(st.one_of(TEXT, st.none()), min_size=1, max_size=8))
def test_text_lists_with_nulls_read_back_as_written(clarion_env, values):
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
        (["a", None, "NULL", "b"], "text[]"),  # None is NULL; the text "NULL" is text
        ([1, None], "bigint[]"),
        ([None, None], "timestamptz[]"),
        ([datetime(2026, 12, 6, 13, 0, tzinfo=UTC), None], "timestamptz[]"),
        ([], "text[]"),
        ([["a", "b"], ["c", "d"]], "text[]"),  # nested: psycopg's own dumper
        ([datetime(2026, 12, 6, 13, 0)], "timestamp[]"),  # naive: psycopg's own
    ],
    ids=[
        "ints",
        "bools",
        "text-with-null",
        "int-with-null",
        "all-null",
        "datetime-with-null",
        "empty",
        "nested",
        "naive-datetime",
    ],
)
def test_other_lists_read_back_as_written(clarion_env, values, sql_type):
    assert _round_trip(values, sql_type) == values


def test_nulls_among_text_are_written_by_the_fast_path(clarion_env):
    assert _dumped(["a", None, "NULL"]) == b'{"a",NULL,"NULL"}'


def test_text_with_nul_is_refused_as_psycopg_refuses_it(clarion_env):
    with pytest.raises(DataError, match="cannot contain NUL") as refused:
        _round_trip(["fine", "nul\x00here"], "text[]")
    assert isinstance(refused.value.orig, errors.DataError)


@pytest.mark.parametrize(
    ("values", "flat"),
    [
        (["a", None], True),
        ([1, 2**40, None], True),
        ([True, None], True),
        ([datetime(2026, 12, 6, 13, 0, tzinfo=UTC)], True),
        ([], True),
        ([["a"], ["b"]], False),
        ([datetime(2026, 12, 6, 13, 0)], False),
    ],
    ids=["text", "ints", "bools", "aware", "empty", "nested", "naive"],
)
def test_a_flat_list_is_sent_untyped_without_psycopg_looking_at_it(clarion_env, values, flat):
    """The fast path skips psycopg's two passes over the elements (get_key, upgrade): the list
    goes as an array of unknown type (oid 0) and the statement's cast or operand types it."""
    with engine().connect() as conn:
        driver = conn.connection.dbapi_connection
        assert isinstance(driver, psycopg.Connection)
        dumper = Transformer.from_context(driver).get_dumper(values, PyFormat.AUTO)
    assert isinstance(dumper, FlatListDumper)
    if flat:
        assert dumper.oid == 0 and dumper.sub_dumper is None
    else:  # psycopg's own upgrade chose the element type
        assert dumper.sub_dumper is not None


def test_a_mixed_list_is_refused_as_psycopg_refuses_it(clarion_env):
    with pytest.raises(DataError, match="cannot dump lists of mixed types"):
        _round_trip([1, "a"], "text[]")


def test_an_untyped_array_takes_the_type_of_what_it_meets(clarion_env):
    """Without a cast: `= ANY(...)` against a bigint, a name, a timestamptz column alike."""
    at = datetime(2026, 12, 6, 13, 0, tzinfo=UTC)
    with engine().connect() as conn:
        assert conn.execute(text("SELECT CAST(5 AS bigint) = ANY(:v)"), {"v": [1, 5]}).scalar()
        assert (
            conn.execute(
                text("SELECT count(*) FROM pg_class WHERE relname = ANY(:names)"),
                {"names": ["pg_class", "pg_type"]},
            ).scalar_one()
            == 2
        )
        assert conn.execute(
            text("SELECT CAST(:at AS timestamptz) = ANY(:v)"), {"at": at, "v": [None, at]}
        ).scalar()
