"""clarion/validation.py: every producer input check, the field it names, and what it lets through."""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from datetime import UTC, datetime, time
from enum import IntEnum, StrEnum

import pytest

from clarion import validation as check
from clarion.errors import ClarionError, InvalidField, InvalidOccurrence, InvalidRequest

# --- text -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "must be a string"),
        (7, "must be a string"),
        (b"ann", "must be a string"),
        ("", "must not be empty"),
        ("a\x00b", "NUL"),
        ("a\ud800b", "lone surrogate at 1"),
        ("x" * 257, "at most 256 bytes"),
        ("é" * 129, "at most 256 bytes of UTF-8, not 258"),
    ],
)
def test_bad_text_names_the_field(value: object, reason: str) -> None:
    with pytest.raises(InvalidField, match=rf"^user_id: .*{re.escape(reason)}") as caught:
        check.text("user_id", value, max_bytes=256)
    assert caught.value.field == "user_id"
    assert reason in caught.value.reason
    assert str(caught.value).startswith("user_id: ")
    assert isinstance(caught.value, InvalidRequest)


@pytest.mark.parametrize("value", ["ann", "é" * 128, "x" * 256, "\\u0000", "emoji 🎉", "tab\there"])
def test_good_text_is_returned(value: str) -> None:
    assert check.text("user_id", value, max_bytes=256) == value


def test_show_never_calls_a_foreign_repr_and_stays_short() -> None:
    class Loud:
        def __repr__(self) -> str:
            raise RuntimeError("boom")

    assert check.show(Loud()) == "a Loud"
    assert len(check.show("x" * 10_000)) <= 41
    assert check.show(10**5000) == "a very large integer"
    assert check.show([1, 2]) == "a list"


# --- variables ------------------------------------------------------------------------------------


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_json_values_pass_and_come_back_as_plain_json() -> None:
    class Plan(StrEnum):
        GOLD = "gold"

    class Level(IntEnum):
        HIGH = 3

    given = OrderedDict(
        name="Ann",
        n=3,
        ratio=0.5,
        ok=True,
        none=None,
        tags=("a", "b"),
        plan=Plan.GOLD,
        level=Level.HIGH,
        deep={"x": [1, {"y": []}]},
        literal="\\u0000",
    )
    plain = check.variables(given)
    assert plain == {
        "name": "Ann",
        "n": 3,
        "ratio": 0.5,
        "ok": True,
        "none": None,
        "tags": ["a", "b"],
        "plan": "gold",
        "level": 3,
        "deep": {"x": [1, {"y": []}]},
        "literal": "\\u0000",
    }
    assert type(plain) is dict and type(plain["tags"]) is list and type(plain["plan"]) is str
    assert type(plain["level"]) is int
    assert json.loads(json.dumps(plain)) == plain


def test_the_literal_text_backslash_u0000_is_fine_but_a_nul_is_not() -> None:
    assert check.variables({"code": "\\u0000"}) == {"code": "\\u0000"}
    with pytest.raises(
        InvalidField, match=r"^variables\.code: must not contain NUL characters$"
    ) as caught:
        check.variables({"code": "a\x00"})
    assert caught.value.field == "variables.code"


@pytest.mark.parametrize(
    ("value", "field", "reason"),
    [
        ([1, 2], "variables", "must be a mapping"),
        ("text", "variables", "must be a mapping"),
        ({"a": {1, 2}}, "variables.a", "not a set"),
        ({"a": b"x"}, "variables.a", "not a bytes"),
        ({"a": object()}, "variables.a", "not a object"),
        ({"a": [1, datetime(2026, 1, 1)]}, "variables.a[1]", "not a datetime"),
        ({"a": float("nan")}, "variables.a", "finite"),
        ({"a": [float("-inf")]}, "variables.a[0]", "finite"),
        ({"a": 2**63}, "variables.a", "64 bits"),
        ({"a": -(2**63) - 1}, "variables.a", "64 bits"),
        ({"a": 10**5000}, "variables.a", "64 bits"),
        ({1: "x"}, "variables", "keys must be strings"),
        ({"a": {None: 1}}, "variables.a", "keys must be strings"),
        ({"a\x00": 1}, "variables key 'a\\x00'", "NUL"),
        ({"a": "\udcff"}, "variables.a", "lone surrogate"),
        ({"a": {"b": ["\x00"]}}, "variables.a.b[0]", "NUL"),
    ],
)
def test_non_json_variables_are_refused_with_the_path(
    value: object, field: str, reason: str
) -> None:
    with pytest.raises(
        InvalidField, match=rf"^{re.escape(field)}: .*{re.escape(reason)}"
    ) as caught:
        check.variables(value)
    assert caught.value.field == field
    assert reason in caught.value.reason


def test_depth_cap_is_16_levels_by_default_and_configurable() -> None:
    assert check.variables(nested(16))
    with pytest.raises(InvalidField, match="deeper than 16 levels"):
        check.variables(nested(17))
    with pytest.raises(InvalidField, match="deeper than 3 levels"):
        check.variables(nested(4), max_depth=3)


def test_very_deep_nesting_is_a_clarion_error_not_a_recursion_error() -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidField, match="deeper"):
        check.variables({"a": deep})


def test_a_cycle_is_refused_by_the_depth_cap() -> None:
    loop: list = []
    loop.append(loop)
    with pytest.raises(InvalidField, match="deeper"):
        check.variables({"a": loop, "b": {"c": loop}})


def test_size_cap_is_64_kib_of_json_by_default_and_configurable() -> None:
    near = {"a": "x" * (65536 - len('{"a":""}'))}
    assert check.variables(near) == near
    with pytest.raises(InvalidField, match="at most 65536 bytes") as caught:
        check.variables({"a": "x" * 65536})
    assert caught.value.field == "variables"
    with pytest.raises(InvalidField, match="at most 100 bytes"):
        check.variables({"a": "é" * 48}, max_bytes=100)  # 96 characters, 103 bytes as JSON
    assert check.variables({"a": "é" * 45}, max_bytes=100)


@pytest.mark.parametrize(
    "value",
    [
        {"a": "\x01" * 20},  # escaped: 6 bytes a character
        {"a": "\U0001f600" * 20},  # 4 bytes of UTF-8 a character
        {"a": [-(2**63), 2**63 - 1, -1.2345678901234567e-308, None, False, True]},
        {"k\x02" * 5: {"n": [[], {}, [{"d": '\\"'}]]}},
    ],
)
def test_the_size_cap_is_exact_where_escapes_make_json_bigger_than_its_text(value) -> None:
    """Values whose JSON is as big as it gets per character or number: the exact size decides,
    whichever way the cheap bound points."""
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    assert check.variables(value, max_bytes=size) == value
    with pytest.raises(InvalidField, match=f"at most {size - 1} bytes as JSON, not {size}"):
        check.variables(value, max_bytes=size - 1)


def test_ten_megabytes_are_refused_quickly() -> None:
    with pytest.raises(InvalidField, match="bytes"):
        check.variables({"blob": "x" * 10_000_000})
    with pytest.raises(InvalidField, match="bytes"):
        check.variables({"many": list(range(5_000_000))})


def test_none_means_no_variables() -> None:
    assert check.variables(None) == {}


# --- addresses ------------------------------------------------------------------------------------

GOOD_ADDRESSES = {
    "email": "ann@example.com",
    "slack": "U0123ABCD",
    "teams": "29:1mia-aad",
    "sms": "+4915112345678",
    "webhook": "https://hooks.example/ann?x=1",
    "push": "fcm:dGVzdC1kZXZpY2UtdG9rZW4 apns:abababababababababababababababababababababababababababababababab",
    "teams_conversation": json.dumps({"conversation": {"id": "a:1"}}),
}


def test_good_addresses_pass_unchanged() -> None:
    assert check.addresses(GOOD_ADDRESSES) == GOOD_ADDRESSES
    assert check.addresses({"slack": "W1", "sms": "+15550100", "webhook": "http://127.0.0.1:9/h"})
    assert check.addresses(None) == {}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (["email"], "addresses"),
        ("ann@example.com", "addresses"),
        ({"Email": "ann@example.com"}, "addresses"),
        ({"": "x"}, "addresses"),
        ({1: "x"}, "addresses"),
        ({"e\x00mail": "x"}, "addresses"),
        ({"email": "not an email"}, "addresses.email"),
        ({"email": "ann@localhost"}, "addresses.email"),
        ({"email": 7}, "addresses.email"),
        ({"slack": "ann"}, "addresses.slack"),
        ({"slack": "u0123"}, "addresses.slack"),
        ({"slack": "C0123ABCD"}, "addresses.slack"),  # a channel, not a user
        ({"teams": ""}, "addresses.teams"),
        ({"sms": "015112345678"}, "addresses.sms"),
        ({"sms": "+1555"}, "addresses.sms"),
        ({"sms": "+1234567890123456"}, "addresses.sms"),
        ({"sms": "+49 151 1234"}, "addresses.sms"),
        ({"webhook": "ftp://h/x"}, "addresses.webhook"),
        ({"webhook": "https:///nohost"}, "addresses.webhook"),
        ({"webhook": "https://h/a b"}, "addresses.webhook"),
        ({"webhook": "http://[::1"}, "addresses.webhook"),
        ({"push": "x" * 3000}, "addresses.push"),
        ({"push": "\ud800"}, "addresses.push"),
        ({f"c{n}": "x" for n in range(33)}, "addresses"),
    ],
)
def test_bad_addresses_name_the_channel(value: object, field: str) -> None:
    with pytest.raises(InvalidField, match=rf"^{re.escape(field)}: ") as caught:
        check.addresses(value)
    assert caught.value.field == field


# --- recipient fields -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "canonical"),
    [
        ("en", "en"),
        ("de-AT", "de-AT"),
        ("zh-Hant-TW", "zh-Hant-TW"),
        ("es-419", "es-419"),
        ("fil", "fil"),
        ("EN", "en"),
        ("en_US", "en-US"),
        ("zh_hant_tw", "zh-Hant-TW"),
    ],
)
def test_locales_are_stored_in_their_canonical_spelling(tag: str, canonical: str) -> None:
    assert check.locale(tag) == canonical


@pytest.mark.parametrize(
    "tag", ["", "e", "en US", " en", "english", "de-", "-AT", "ü", None, 1, "en-" + "x" * 40]
)
def test_bad_locales(tag: object) -> None:
    with pytest.raises(InvalidField, match=r"^locale: must ") as caught:
        check.locale(tag)
    assert caught.value.field == "locale"


def test_country_and_subdivision() -> None:
    assert check.country("de") == "DE" and check.country(None) is None
    assert check.subdivision("by") == "BY" and check.subdivision("13") == "13"
    assert check.subdivision("ENG") == "ENG" and check.subdivision(None) is None
    for bad in ("DEU", "D", "", "1A", 49, "ÉS"):
        with pytest.raises(InvalidField, match="ISO 3166"):
            check.country(bad)
    for bad in ("DE-BY", "", "ABCD", "B Y", "ü", 3, "\x00"):
        with pytest.raises(InvalidField, match="ISO 3166-2") as caught:
            check.subdivision(bad)
        assert caught.value.field == "subdivision"


def test_workweek() -> None:
    assert check.workweek([6, 0, 1, 2, 3, 0]) == [0, 1, 2, 3, 6]
    assert check.workweek((0,)) == [0] and check.workweek(None) is None
    for bad in ([], [7], [-1], [True], ["1"], "0123", {"a": 1}, [0.5], 5):
        with pytest.raises(InvalidField, match="weekdays"):
            check.workweek(bad)


def test_quiet_hours() -> None:
    assert check.quiet_hours(("22:00", "07:00")) == (time(22), time(7))
    assert check.quiet_hours([time(23, 30), "00:30"]) == (time(23, 30), time(0, 30))
    assert check.quiet_hours(None) == (None, None)
    for bad, field in (
        (("22:00",), "quiet_hours"),
        ("22:00-07:00", "quiet_hours"),
        (("24:00", "07:00"), "quiet_hours[0]"),
        (("22:00", "7:00"), "quiet_hours[1]"),
        (("22:00", None), "quiet_hours[1]"),
        (("22:00", "０７:００"), "quiet_hours[1]"),
        ((time(22, tzinfo=UTC), "07:00"), "quiet_hours[0]"),
    ):
        with pytest.raises(InvalidField, match=rf"^{re.escape(field)}: must be ") as caught:
            check.quiet_hours(bad)
        assert caught.value.field == field


# --- occurrence keys ------------------------------------------------------------------------------


def test_occurrence_keys() -> None:
    assert check.occurrence_key("e1", None) == "event:e1"
    assert check.occurrence_key(None, "invoice-7") == "invoice-7"
    assert (
        check.occurrence_key("series:1:2", None) == "event:series:1:2"
    )  # an event id is namespaced


@pytest.mark.parametrize(
    ("event_id", "key", "field"),
    [
        (None, None, "occurrence_key"),
        ("e", "k", "occurrence_key"),
        ("", None, "event_id"),
        (None, "", "occurrence_key"),
        (None, 7, "occurrence_key"),
        (["e"], None, "event_id"),
        ("e\x00", None, "event_id"),
        (None, "series:12:0", "occurrence_key"),
        (None, "series:", "occurrence_key"),
        (None, "k" * 513, "occurrence_key"),
        ("e" * 513, None, "event_id"),  # 512 bytes is the limit (docs/getting-started.md)
    ],
)
def test_bad_occurrence_keys(event_id: object, key: object, field: str) -> None:
    with pytest.raises(InvalidOccurrence, match=rf"^{field}: ") as caught:
        check.occurrence_key(event_id, key)
    assert caught.value.field == field
    assert isinstance(caught.value, ClarionError)


def test_positive_int_and_aware_datetime() -> None:
    assert check.positive_int("count", 3, maximum=10) == 3
    for bad in (0, -1, 11, True, 2.0, "3"):
        with pytest.raises(InvalidField, match="count"):
            check.positive_int("count", bad, maximum=10)
    assert check.aware_datetime("until", datetime(2026, 1, 1, tzinfo=UTC))
    for bad in (datetime(2026, 1, 1), "2026-01-01T00:00+00:00", None):  # type: ignore[assignment]
        with pytest.raises(InvalidField, match="until"):
            check.aware_datetime("until", bad)
