"""Fuzz POST /v1/events and /v1/events/batch through the real door (TestClient on web.app, a valid
API key, sometimes an Idempotency-Key): near-valid events with one defect each (wrong types, NUL,
lone surrogates, huge, deep, reserved, unknown members), bodies that are not JSON objects, too
big, too deep, not UTF-8, and wrong content types.

Every answer is a 4xx in the API's error shape naming a field or the body — for an event defect the
defective member, under `items[i]` in a batch — never a 5xx; and nothing is written or published.
Real PostgreSQL and Redis; deterministic (derandomize=True)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clarion.web.api_errors import safe_field
from tests.support.api import _broker, ann, bearer, client, event, nested, written
from tests.support.pipeline import published

pytestmark = pytest.mark.integration
__all__ = ["_broker", "ann", "client"]

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
FIELDS = ("event_id", "user_id", "type", "variables", "dedup_key", "priority")

NOT_TEXT = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
BAD_TEXT = st.one_of(
    NOT_TEXT,
    st.just(""),
    st.text(max_size=5).map(lambda t: t + "\x00"),
    st.sampled_from(["\ud800", "a\udfff", "\udbff\udc00\ud800"]),
    st.integers(600, 5000).map(lambda n: "x" * n),
)
JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8)
)
BAD_VARIABLES = st.one_of(
    NOT_TEXT.filter(lambda v: not isinstance(v, dict)),
    st.text(max_size=4),
    st.just({}),  # receipt needs `order`
    st.sampled_from([2**63, -(2**63) - 1, 10**30]).map(lambda n: {"order": n}),
    st.sampled_from(["\x00", "a\ud800", "x\x00y"]).map(lambda s: {"order": "A", "note": s}),
    st.sampled_from(["k\x00", "\udc80"]).map(lambda k: {"order": "A", k: 1}),
    st.integers(17, 400).map(lambda d: {"order": "A", "deep": nested(d)}),
    st.integers(70_000, 200_000).map(lambda n: {"order": "A", "big": "x" * n}),
)
DEFECTS: dict[str, Any] = {
    "event_id": st.one_of(BAD_TEXT, st.none()),
    "user_id": st.one_of(
        BAD_TEXT, st.none(), st.text(min_size=1, max_size=20).filter(lambda u: u != "ann")
    ),
    "type": st.one_of(
        BAD_TEXT,
        st.none(),
        st.text(min_size=1, max_size=20).filter(lambda t: t not in ("receipt",)),
    ),
    "variables": BAD_VARIABLES,
    "dedup_key": st.one_of(BAD_TEXT, st.text(max_size=10).map(lambda t: "series:" + t)),
    "priority": st.one_of(
        JSON_LEAF.filter(lambda p: p not in (None, "transactional")), st.just("activation")
    ),
}


@st.composite
def defective_event(draw) -> tuple[dict[str, Any], str]:
    """A receipt event for ann with exactly one defect, and the field an answer must name."""
    body = event(
        event_id=draw(
            st.text(min_size=1, max_size=10).filter(
                lambda t: (
                    "\x00" not in t
                    and t.encode("utf-8", "surrogatepass") == t.encode("utf-8", "ignore")
                )
            )
        )
    )
    kind = draw(st.sampled_from([*FIELDS, "missing", "unknown member"]))
    if kind == "missing":
        name = draw(st.sampled_from(["event_id", "user_id", "type"]))
        del body[name]
        return body, name
    if kind == "unknown member":
        name = draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in FIELDS))
        body[name] = draw(JSON_LEAF)
        return body, name
    body[kind] = draw(DEFECTS[kind])
    return body, kind


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode("ascii")  # lone surrogates travel escaped, as JSON allows


RAW_BODIES = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [b"", b"{", b"null", b"[]", b'"text"', b"1e999999", b"\xff\xfe{}", b'{"a":NaN}']
    ),
    st.integers(1000, 200_000).map(lambda n: b"[" * n),
    st.integers(1000, 50_000).map(lambda n: b'{"a":' * n),
    st.just(b'{"event_id": "' + b"x" * 6_000_000 + b'"}'),
    st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=3), max_leaves=6).map(dumps),
)
BAD_TYPES = st.sampled_from(
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/json; charset=latin-1",
        "multipart/form-data",
        "application/jsonx",
    ]
)


def check_refusal(answer, field: str | None = None) -> str:
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:300])
    body = answer.json()
    assert set(body) >= {"error", "field", "reason"}, body
    assert isinstance(body["field"], str) and body["field"], body
    if field is not None:
        assert body["field"].startswith(field), (field, body)
    return body["field"]


@pytest.fixture
def door(client, ann):
    headers = bearer(rate=(1_000_000, 1))
    before = written()
    seen: list[str] = []
    yield client, headers, seen
    assert written() == before
    assert not published("transactional") and not published("activation")
    assert {f.split(".")[0].split("[")[0] for f in seen} >= {
        "event_id",
        "user_id",
        "type",
        "variables",
    }


def _post(
    client,
    path: str,
    content: bytes,
    headers: dict[str, str],
    content_type: str | None,
    idem: str | None,
):
    extra = {} if content_type is None else {"Content-Type": content_type}
    if idem is not None:
        extra["Idempotency-Key"] = idem
    return client.post(path, content=content, headers={**headers, **extra})


@FUZZ
@given(
    case=defective_event(),
    idem=st.none() | st.just("fuzz-key"),
    batch=st.none() | st.integers(0, 3),
)
def test_a_defective_event_is_refused_naming_its_field(door, case, idem, batch):
    client, headers, seen = door
    body, field = case
    if batch is None:
        answer = _post(client, "/v1/events", dumps(body), headers, "application/json", idem)
    else:
        items = [event(event_id=f"ok{i}") for i in range(4)]
        items[batch] = body
        answer = _post(
            client, "/v1/events/batch", dumps({"items": items}), headers, "application/json", idem
        )
        field = f"items[{batch}].{field}"
    if answer.status_code == 413:  # a huge member can make the whole body too big
        assert check_refusal(answer) == "body"
        return
    named = check_refusal(answer, safe_field(field))
    seen.append(named.removeprefix(f"items[{batch}]."))


@FUZZ
@given(
    raw=RAW_BODIES,
    content_type=st.just("application/json") | BAD_TYPES,
    path=st.sampled_from(["/v1/events", "/v1/events/batch"]),
)
def test_a_body_that_is_not_an_event_is_refused_at_the_body(door, raw, content_type, path):
    client, headers, seen = door
    answer = _post(client, path, raw, headers, content_type, None)
    where = check_refusal(answer)
    if content_type != "application/json":
        assert (answer.status_code, where) == (415, "Content-Type")
    else:
        assert where in ("body", "items") or where.startswith(
            ("event_id", "user_id", "type", "items")
        ), where
    seen.extend(["event_id", "user_id", "type", "variables"])  # this test's door checks differ
