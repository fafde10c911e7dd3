"""Digests without services: options.digest checked at load, windows in the recipient's time, and
the summary line's guard (deadline, junk, fallback)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from datetime import time as wall
from typing import Any

import pytest

from clarion.catalog import Catalog, CatalogError
from clarion.catalog.digest import DigestSpec, parse_window, render_fallback
from clarion.gates.contract import Snapshot
from clarion.gates.pipeline import plan
from clarion.scheduling.digests import window_due
from clarion.tasks.summarise import SummaryRequest, clean, summary_line
from tests.support.records import recipient as fake_recipient
from tests.support.records import request as fake_request


def _catalog(digest: Any, target: dict | None = None) -> Catalog:
    return Catalog.from_dict(
        {
            "types": {
                "reply": {
                    "category": "activation",
                    "channels": ["webhook"],
                    "required": ["seller"],
                    "options": {"digest": digest},
                    "templates": [{"version": 1, "body": "{{ seller }}"}],
                },
                "replies": target
                or {
                    "category": "digest",
                    "channels": ["webhook"],
                    "required": ["count", "items", "summary"],
                    "templates": [{"version": 1, "body": "{{ summary }} ({{ count }})"}],
                },
            }
        },
        "digests.yaml",
    )


def test_a_digest_loads_with_its_defaults():
    spec = _catalog({"type": "replies", "window": "1h"}).types["reply"].digest
    assert spec == DigestSpec(type="replies", every=timedelta(hours=1))
    assert spec.window == "1:00:00"


@pytest.mark.parametrize(
    ("digest", "message"),
    [
        ("hourly", "options.digest must be a mapping"),
        ({"window": "1h"}, "options.digest.type must name the digest type"),
        ({"type": "replies", "window": "hourly"}, "window must be a duration"),
        ({"type": "replies", "window": "0s"}, "window must be a duration"),
        ({"type": "replies", "window": "daily 25:00"}, "window must be a duration"),
        ({"type": "replies", "window": "1h", "max_items": 0}, "max_items must be a number"),
        ({"type": "replies", "window": "1h", "max_items": 101}, "max_items must be a number"),
        ({"type": "replies", "window": "1h", "max_items": True}, "max_items must be a number"),
        ({"type": "replies", "window": "1h", "summary_timeout": 60}, "summary_timeout"),
        ({"type": "replies", "window": "1h", "every": "1h"}, "unknown fields \\['every'\\]"),
        ({"type": "replies", "window": "1h", "key": "{{ order }}"}, "key may only use"),
        ({"type": "replies", "window": "1h", "key": "{{ x "}, "options.digest: unexpected"),
        ({"type": "replies", "window": "1h", "fallback": "{{ seller }}"}, "fallback may use only"),
        ({"type": "nope", "window": "1h"}, "options.digest.type 'nope' is not a type"),
        ({"type": "reply", "window": "1h"}, "must be a category 'digest' type"),
    ],
)
def test_a_bad_digest_is_refused_at_load_naming_the_field(digest, message):
    with pytest.raises(CatalogError, match=message) as error:
        _catalog(digest)
    assert str(error.value).startswith("digests.yaml: type 'reply'")


def test_a_digest_type_may_use_only_the_digest_variables():
    target = {
        "category": "digest",
        "channels": ["webhook"],
        "required": ["count", "seller"],
        "templates": [{"version": 1, "body": "{{ count }} from {{ seller }}"}],
    }
    with pytest.raises(CatalogError, match="uses seller; a digest carries only count, items"):
        _catalog({"type": "replies", "window": "1h"}, target)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30s", (timedelta(seconds=30), None)),
        ("15m", (timedelta(minutes=15), None)),
        (" 2d ", (timedelta(days=2), None)),
        ("daily 08:00", (None, wall(8, 0))),
        ("daily 7:05", (None, wall(7, 5))),
    ],
)
def test_windows_parse(value, expected):
    assert parse_window(value) == expected


@pytest.mark.parametrize(
    ("opened", "zone", "due"),
    [
        # 19:00 in Tokyo: the next 08:00 is tomorrow's
        (datetime(2026, 12, 7, 10, 0, tzinfo=UTC), "Asia/Tokyo", datetime(2026, 12, 7, 23, 0)),
        # 07:59 in Berlin: today's 08:00
        (datetime(2026, 12, 7, 6, 59, tzinfo=UTC), "Europe/Berlin", datetime(2026, 12, 7, 7, 0)),
        # exactly 08:00 in Berlin: a window opened at its close flushes tomorrow
        (datetime(2026, 12, 7, 7, 0, tzinfo=UTC), "Europe/Berlin", datetime(2026, 12, 8, 7, 0)),
        # New York across the spring change: 08:00 EDT is 12:00 UTC, the day before 13:00
        (datetime(2026, 3, 7, 14, 0, tzinfo=UTC), "America/New_York", datetime(2026, 3, 8, 12, 0)),
    ],
)
def test_a_daily_window_closes_at_the_next_local_wall_time(opened, zone, due):
    assert window_due(opened, zone, every=None, daily=wall(8, 0)) == due.replace(tzinfo=UTC)


def test_the_digest_gate_stops_a_digested_request_after_the_channel_gates():
    catalog = _catalog({"type": "replies", "window": "30m", "key": "{{ seller }}"})
    now = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
    recipient = fake_recipient(user_id="u")
    request = fake_request("reply", user_id="u", variables={"seller": "ann"})
    planned = plan(
        request,
        catalog.types["reply"],
        Snapshot(recipient),
        now=now,
        policy=catalog.policy,
        needs_address={"webhook": False},
    )
    assert planned.outcome == "digest" and planned.channels == ()
    assert planned.digest is not None
    assert (planned.digest.key, planned.digest.due_at) == ("ann", now + timedelta(minutes=30))
    assert [(s.gate, s.outcome) for s in planned.steps] == [
        ("preferences", "allow"),
        ("digest", "digest"),
    ]


def _request(timeout: float = 0.2, max_chars: int = 40) -> SummaryRequest:
    return SummaryRequest(
        "replies", 2, ({"seller": "a"},), "2 new updates", max_chars, timeout, "m"
    )


def test_a_stalled_summariser_is_not_waited_on_past_its_timeout():
    started = time.monotonic()
    line = summary_line(lambda r: time.sleep(5), _request(timeout=0.2))
    assert line == ("2 new updates", "timeout")
    assert time.monotonic() - started < 0.6


@pytest.mark.parametrize(
    ("answer", "why"),
    [("x" * 41, "junk"), ("", "junk"), (None, "junk"), (b"bytes", "junk"), ("a\nb", "junk")],
)
def test_junk_gives_the_fallback(answer, why):
    assert summary_line(lambda r: answer, _request()) == ("2 new updates", why)


def test_a_raising_summariser_gives_the_fallback():
    def boom(request: SummaryRequest) -> str:
        raise TimeoutError("model down")

    assert summary_line(boom, _request()) == ("2 new updates", "error")
    assert summary_line(None, _request()) == ("2 new updates", "none")
    assert summary_line(lambda r: "  Two replies  ", _request()) == ("Two replies", "summariser")
    assert clean("ok\x07", 10) is None


def test_the_fallback_line_is_deterministic_and_survives_bad_items():
    spec = DigestSpec(type="d", fallback="{{ items | map(attribute='seller') | unique | list }}")
    assert render_fallback(spec, {"count": 1, "items": [{"seller": "a"}]}) == "['a']"
    # an item without the attribute: the default line
    assert render_fallback(spec, {"count": 3, "items": [{}]}) == "3 new updates"


def test_a_summariser_that_does_not_load_gives_the_fallback():
    from clarion.db.digests import Closed
    from clarion.tasks.flush import digest_variables

    window = Closed("u", 1, 2, "replies", "", datetime(2026, 12, 7, tzinfo=UTC), [{"at": "t"}])
    spec = DigestSpec(type="replies", summariser="no_such_module:summarise")
    variables = digest_variables(window, spec)
    assert (variables["summary"], variables["summary_source"]) == ("1 new update", "unavailable")
    assert variables["count"] == 1 and variables["first_at"] == "t"
