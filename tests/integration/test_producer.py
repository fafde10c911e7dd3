"""The producer API at enqueue time: bad calls fail loudly and write nothing; repeats are recognised.

Every refused call is checked twice: the typed error it raises, and the row counts before and after.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from clarion.db.engine import engine
from clarion.errors import (
    InvalidOccurrence,
    InvalidRequest,
    InvalidTimezone,
    MissingVariables,
    UnknownRecipient,
    UnknownType,
)
from clarion.tasks import notify, notify_many, register_recipient
from clarion.tasks.publish import ROUTE
from tests.support.api import _broker, ann
from tests.support.pipeline import (
    configure,
    count,
    counts,
    drain,
    published,
    rows,
)
from tests.support.race import held, race

pytestmark = pytest.mark.integration

ORDER = {"order": "A-1"}


__all__ = ["_broker", "ann"]  # fixtures, from tests/support/api.py


# --- notify(): refused calls ------------------------------------------------------------------

REFUSED = {
    "unknown type": (dict(type_key="no_such_type", event_id="e1", variables=ORDER), UnknownType),
    "missing variable": (dict(type_key="receipt", event_id="e1", variables={}), MissingVariables),
    "unknown recipient": (
        dict(user_id="bob", type_key="receipt", event_id="e1", variables=ORDER),
        UnknownRecipient,
    ),
    "neither event nor occurrence": (dict(type_key="receipt", variables=ORDER), InvalidOccurrence),
    "both event and occurrence": (
        dict(type_key="receipt", event_id="e1", occurrence_key="k1", variables=ORDER),
        InvalidOccurrence,
    ),
    "empty event id": (dict(type_key="receipt", event_id="", variables=ORDER), InvalidOccurrence),
    "empty occurrence key": (
        dict(type_key="receipt", occurrence_key="", variables=ORDER),
        InvalidOccurrence,
    ),
    "non-string occurrence key": (
        dict(type_key="receipt", occurrence_key=7, variables=ORDER),
        InvalidOccurrence,
    ),
    "variables not JSON (object)": (
        dict(type_key="receipt", event_id="e1", variables={"order": object()}),
        InvalidRequest,
    ),
    "variables not JSON (set)": (
        dict(type_key="receipt", event_id="e1", variables={"order": "A", "extra": {1, 2}}),
        InvalidRequest,
    ),
}


# What each refusal says: it names the type, the recipient or the field at fault.
REFUSAL = {
    "unknown type": r"^unknown notification type 'no_such_type': not in catalog ",
    "missing variable": r"^type 'receipt' needs variables: order$",
    "unknown recipient": r"^unknown recipient 'bob'$",
    "neither event nor occurrence": r"^occurrence_key: give exactly one of event_id or occurrence_key$",
    "both event and occurrence": r"^occurrence_key: give exactly one of event_id or occurrence_key$",
    "empty event id": r"^event_id: must not be empty$",
    "empty occurrence key": r"^occurrence_key: must not be empty$",
    "non-string occurrence key": r"^occurrence_key: must be a string, not 7$",
    "variables not JSON (object)": r"^variables\.order: must be a JSON value .*, not a object$",
    "variables not JSON (set)": r"^variables\.extra: must be a JSON value .*, not a set$",
}


@pytest.mark.parametrize(
    "call, error, refusal", [(*REFUSED[k], REFUSAL[k]) for k in REFUSED], ids=REFUSED.keys()
)
def test_a_bad_notify_call_raises_a_typed_error_and_writes_nothing(ann, call, error, refusal):
    call = dict(call)
    before = counts()
    with pytest.raises(error, match=refusal):
        notify(call.pop("user_id", ann), **call)
    assert counts() == before
    assert published("transactional")[ROUTE] == []


def test_the_typed_errors_carry_what_was_wrong(ann):
    with pytest.raises(
        UnknownType, match="unknown notification type 'no_such_type'"
    ) as unknown_type:
        notify(ann, "no_such_type", event_id="e1")
    with pytest.raises(UnknownRecipient, match="unknown recipient 'bob'") as unknown_recipient:
        notify("bob", "receipt", event_id="e1", variables=ORDER)
    with pytest.raises(MissingVariables, match="'receipt' needs variables: order") as missing:
        notify(ann, "receipt", event_id="e1", variables={"other": 1})
    assert unknown_type.value.type_key == "no_such_type"
    assert unknown_recipient.value.user_id == "bob"
    assert (missing.value.type_key, missing.value.missing) == ("receipt", ["order"])
    assert count("requests") == 0


def test_missing_variables_lists_every_missing_name(clarion_env, monkeypatch, tmp_path: Path):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "types:\n"
        "  invoice:\n"
        "    category: transactional\n"
        "    channels: [webhook]\n"
        "    required: [order, total, due]\n"
        "    templates:\n"
        "      - version: 1\n"
        "        body: '{{ order }} {{ total }} {{ due }}'\n"
    )
    configure(monkeypatch, catalog=catalog)
    register_recipient("ann", timezone="UTC")
    with pytest.raises(MissingVariables, match="due, total") as missing:
        notify("ann", "invoice", event_id="e1", variables={"order": "A-1"})
    assert missing.value.missing == ["due", "total"]
    assert count("requests") == 0


def test_a_refused_outbox_call_leaves_the_callers_transaction_usable(ann):
    """Validation happens before any SQL, so the caller's transaction is not aborted by it."""
    with engine().begin() as conn:
        with pytest.raises(UnknownRecipient, match="unknown recipient 'bob'"):
            notify("bob", "receipt", event_id="e1", variables=ORDER, connection=conn)
        enqueued = notify(ann, "receipt", event_id="e1", variables=ORDER, connection=conn)
    assert enqueued.new
    assert count("requests") == 1


# Input the producer's checks let through to the database, which then refuses it with a driver error
# (sqlalchemy DataError / IntegrityError) instead of the typed InvalidRequest the API promises.
REACHES_THE_DATABASE = {
    "NaN variable": dict(variables={"order": float("nan")}),
    "Infinity variable": dict(variables={"order": float("inf")}),
    "NUL in a variable": dict(variables={"order": "A\x001"}),
    "NUL in the event id": dict(event_id="e\x001"),
    "user_id None": dict(user_id=None),
}
# The field each is refused by, before PostgreSQL sees it.
STORED_FIELD = {
    "NaN variable": r"^variables\.order: numbers must be finite, not nan$",
    "Infinity variable": r"^variables\.order: numbers must be finite, not inf$",
    "NUL in a variable": r"^variables\.order: must not contain NUL characters$",
    "NUL in the event id": r"^event_id: must not contain NUL characters$",
    "user_id None": r"^user_id: must be a string, not None$",
}


@pytest.mark.parametrize(
    "bad, refusal",
    [(REACHES_THE_DATABASE[k], STORED_FIELD[k]) for k in REACHES_THE_DATABASE],
    ids=REACHES_THE_DATABASE.keys(),
)
def test_input_postgresql_cannot_store_is_refused_with_a_typed_error(ann, bad, refusal):
    call = {"user_id": ann, "type_key": "receipt", "event_id": "e1", "variables": ORDER, **bad}
    before = counts()
    with pytest.raises(InvalidRequest, match=refusal):
        notify(call.pop("user_id"), call.pop("type_key"), **call)
    assert counts() == before


# --- register_recipient(): refused calls ---------------------------------------------------------

BAD_ZONES = [
    "Mars/Olympus_Mons",
    "",
    "europe/berlin",
    "Europe/Berlin ",
    "/etc/localtime",
    "../zoneinfo/UTC",
    "Europe/../UTC",
    "zone.tab",
    None,
    "Europe",
    "x" * 300,  # a folder of zones, a name too long for a file: OSError in ZoneInfo
    "localtime",
    "posix/UTC",
]  # files in the zone folder that are not IANA names


def test_a_bad_timezone_is_refused_and_writes_nothing(clarion_env):
    for zone in BAD_ZONES:
        with pytest.raises(InvalidTimezone, match="timezone: not an IANA time zone"):
            register_recipient("ann", timezone=zone)
    assert count("recipients") == 0


def test_a_bad_country_is_refused_and_writes_nothing(clarion_env):
    for country in ["DEU", "D", "", "1A", "D-", 49]:
        with pytest.raises(InvalidRequest, match="ISO 3166"):
            register_recipient("ann", timezone="Europe/Berlin", country=country)
    assert count("recipients") == 0


def test_a_country_code_with_non_ascii_letters_is_refused(clarion_env):
    with pytest.raises(InvalidRequest, match="ISO 3166"):
        register_recipient("ann", timezone="Europe/Madrid", country="ÉS")
    assert count("recipients") == 0


def test_a_refused_update_leaves_the_existing_recipient_as_it_was(ann):
    with pytest.raises(InvalidTimezone, match="not an IANA time zone: 'Nowhere/Land'"):
        register_recipient(ann, timezone="Nowhere/Land", country="FR")
    with pytest.raises(InvalidRequest, match="ISO 3166"):
        register_recipient(ann, timezone="Europe/Paris", country="France")
    assert rows("SELECT timezone, country FROM recipients") == [
        {"timezone": "Europe/Berlin", "country": "DE"}
    ]


def test_a_valid_registration_normalises_the_country_and_updates_in_place(ann):
    for zone in ("UTC", "Etc/GMT+5", "America/Argentina/Buenos_Aires"):
        register_recipient("bob", timezone=zone)
    register_recipient(
        ann,
        timezone="Asia/Jerusalem",
        country="il",
        addresses={"webhook": "https://hooks.example/ann"},
    )
    assert rows(
        "SELECT user_id, timezone, country, addresses FROM recipients ORDER BY user_id"
    ) == [
        {
            "user_id": "ann",
            "timezone": "Asia/Jerusalem",
            "country": "IL",
            "addresses": {"webhook": "https://hooks.example/ann"},
        },
        {
            "user_id": "bob",
            "timezone": "America/Argentina/Buenos_Aires",
            "country": None,
            "addresses": {},
        },
    ]


# --- notify_many(): all or nothing -----------------------------------------------------------

BAD_ITEM = {
    "validation error": dict(user_id="ann", type_key="receipt", event_id="e9", variables={}),
    "unknown recipient": dict(user_id="bob", type_key="receipt", event_id="e9", variables=ORDER),
}
BAD_ITEM_REFUSAL = {
    "validation error": r"^type 'receipt' needs variables: order\nin items\[2\]$",
    "unknown recipient": r"^unknown recipient 'bob'$",
}


@pytest.mark.parametrize(
    "bad, refusal", [(BAD_ITEM[k], BAD_ITEM_REFUSAL[k]) for k in BAD_ITEM], ids=BAD_ITEM.keys()
)
def test_notify_many_with_one_bad_item_writes_nothing(ann, bad, refusal):
    good = [
        dict(user_id=ann, type_key="receipt", event_id=f"e{n}", variables=ORDER) for n in range(3)
    ]
    before = counts()
    with pytest.raises(InvalidRequest, match=refusal):
        notify_many([*good[:2], bad, good[2]])
    assert counts() == before
    assert published("transactional")[ROUTE] == []


def test_notify_many_with_nothing_to_do_writes_nothing(ann):
    assert notify_many([]) == []
    assert count("requests") == 0


# --- insert_grouped(): many callers' rows in one statement, as the web writes them ------------


def test_grouped_callers_get_their_own_outcomes_as_if_they_came_one_by_one(ann):
    from datetime import UTC, datetime

    from clarion.db.loop_commit import LoopCommit
    from clarion.tasks.producer import checked_requests, insert_grouped

    def rows_of(*events: tuple[str, str]) -> list:
        return checked_requests(
            [dict(user_id=u, type_key="receipt", event_id=e, variables=ORDER) for u, e in events]
        )

    earlier = notify(ann, "receipt", event_id="e0", variables=ORDER)
    groups = [
        rows_of((ann, "e1")),
        rows_of((ann, "e2"), ("bob", "e3")),  # bob is unknown: this caller alone is refused
        rows_of((ann, "e1"), (ann, "e4")),  # e1 again, after the first caller's
        rows_of((ann, "e0")),  # requested before
    ]
    now = datetime.now(UTC)
    calls: list[int] = []

    async def batch(conn, payloads):
        calls.append(len(payloads))
        return await insert_grouped(conn, payloads, now=now, due_at=now)

    async def together() -> list:
        writer = LoopCommit(batch, connections=1)
        return await asyncio.gather(
            *(writer.submit_rows(g) for g in groups), return_exceptions=True
        )

    first, refused, third, fourth = asyncio.run(together())
    assert calls == [4]  # the four callers in one statement
    assert isinstance(refused, UnknownRecipient) and refused.user_id == "bob"
    assert isinstance(first, list) and isinstance(third, list) and isinstance(fourth, list)
    assert [e.new for e in first] == [True]
    assert [e.new for e in third] == [False, True]
    assert third[0].request_id == first[0].request_id
    assert fourth == [type(first[0])(earlier.request_id, False)]
    keys = rows("SELECT occurrence_key FROM requests ORDER BY occurrence_key")
    assert [r["occurrence_key"] for r in keys] == ["event:e0", "event:e1", "event:e4"]


# --- repeats -----------------------------------------------------------------------------------


def test_a_repeated_event_returns_the_same_request_and_publishes_nothing_new(ann):
    first = notify(ann, "receipt", event_id="e1", variables=ORDER)
    again = notify(ann, "receipt", event_id="e1", variables={"order": "changed"})
    assert first.new and not again.new
    assert again.request_id == first.request_id
    assert rows("SELECT id, occurrence_key, variables FROM requests") == [
        {"id": first.request_id, "occurrence_key": "event:e1", "variables": ORDER}
    ]
    assert published("transactional")[ROUTE] == [(ann, first.request_id)]


def test_one_event_is_a_separate_occurrence_per_type_and_per_recipient(ann):
    register_recipient("bob", timezone="UTC")
    ids = {
        notify(ann, "receipt", event_id="e1", variables=ORDER).request_id,
        notify("bob", "receipt", event_id="e1", variables=ORDER).request_id,
        notify(ann, "security_code", event_id="e1", variables={"code": "123"}).request_id,
    }
    assert len(ids) == 3
    assert count("requests") == 3


def test_notify_many_maps_duplicates_inside_one_batch_to_one_request(ann):
    earlier = notify(ann, "receipt", event_id="old", variables=ORDER)
    drain("transactional")  # drop the earlier publication
    item = lambda event: dict(user_id=ann, type_key="receipt", event_id=event, variables=ORDER)  # noqa: E731
    result = notify_many([item("a"), item("a"), item("b"), item("old"), item("a"), item("b")])
    a, b = result[0].request_id, result[2].request_id
    assert [e.request_id for e in result] == [a, a, b, earlier.request_id, a, b]
    assert [e.new for e in result] == [True, False, True, False, False, False]
    assert count("requests") == 3
    assert sorted(published("transactional")[ROUTE]) == sorted([(ann, a), (ann, b)])


def _notify_once(user: str) -> tuple[int, bool]:
    enqueued = notify(user, "receipt", event_id="same", variables=ORDER)
    return enqueued.request_id, enqueued.new


def test_eight_processes_notifying_one_event_create_one_request_and_one_is_told_new(ann):
    # Writes to requests are held off (SHARE conflicts with an INSERT's ROW EXCLUSIVE) until all
    # eight inserts queue on it: then they race for the one request at once
    with held("LOCK TABLE requests IN SHARE MODE", {}, waiters=8) as queued:
        results = race(8, _notify_once, lambda i: (ann,))
    assert queued.waiters == 8 and queued.all_in("INSERT INTO requests"), (
        queued.statements
    )  # they met there
    assert len({request_id for request_id, _ in results}) == 1
    assert sorted(new for _, new in results) == [False] * 7 + [True]
    assert count("requests") == 1
    assert len(published("transactional")[ROUTE]) == 1
