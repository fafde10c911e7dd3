"""ops/preview.py without services: every channel's request is built by its adapter's own code
from the version's samples, in the asked locale; what is unknown is an InvalidRequest naming it."""

from __future__ import annotations

import json

import pytest

from clarion.catalog import Catalog
from clarion.errors import InvalidRequest, UnknownType
from clarion.ops.preview import preview, readable
from clarion.ops.preview_channels import BUILDERS
from clarion.settings import Settings

CHANNELS = ["console", "webhook", "slack", "teams", "email", "sms", "push", "in_app"]
CATALOG = Catalog.from_dict(
    {
        "types": {
            "t": {
                "category": "transactional",
                "channels": CHANNELS,
                "required": ["name"],
                "templates": [
                    {"version": 1, "title": "old", "body": "old"},
                    {
                        "version": 2,
                        "title": "Hi {{ name }}",
                        "body": "**Welcome** {{ name }} 🎉",
                        "samples": {"name": "Ada"},
                        "buttons": [{"key": "ok", "label": "OK"}],
                        "locales": {"de": {"title": "Hallo {{ name }}"}},
                    },
                ],
            }
        }
    }
)
NTYPE = CATALOG.get("t")


def test_every_channel_has_its_adapters_request_builder() -> None:
    assert set(BUILDERS) == set(CHANNELS)
    shown = {r.channel: r for r in preview(NTYPE, "t", Settings(), locale="de-CH")}
    assert list(shown) == CHANNELS
    for r in shown.values():
        assert (r.version, r.locale, r.chain, r.error) == (2, "de", ("de", "en"), None)
        assert r.content["title"] == "Hallo Ada"
        json.dumps(r.to_json())  # every request is JSON
    assert shown["slack"].request["blocks"][-1]["type"] == "actions"  # the catalog's buttons
    assert shown["teams"].request["card"]["body"][1]["text"].startswith("\\*\\*Welcome\\*\\*")
    assert shown["email"].request["subject"] == "Hallo Ada"
    assert shown["sms"].request["encoding"] == "UCS-2"  # the emoji
    assert shown["push"].request["fcm"]["message"]["notification"]["title"] == "Hallo Ada"
    assert shown["in_app"].request["data"]["buttons"][0]["label"] == "OK"
    assert shown["webhook"].request["body"]["content"]["title"] == "Hallo Ada"
    assert shown["webhook"].request["headers"]["Idempotency-Key"].startswith("clk_")
    assert "Hallo Ada" in shown["console"].request["line"]
    text = readable(list(shown.values()))
    assert "teams — t v2, locale de → en (asked de-CH)" in text


def test_version_variables_and_one_channel() -> None:
    [old] = preview(NTYPE, "t", Settings(), version=1, channel="sms")
    assert old.request["body"] == "old\nold"
    [mine] = preview(NTYPE, "t", Settings(), channel="email", variables={"name": "Bo"})
    assert mine.request["subject"] == "Hi Bo"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"version": 3}, r"type 't' has no version 3 \(it has: 1, 2\)"),
        ({"channel": "fax"}, r"type 't' has no channel 'fax' \(it has: console, email"),
        ({"locale": "fr"}, r"type 't' v2 has no strings for locale 'fr' \(it has: en, de\)"),
        ({"locale": "de", "version": 1}, r"type 't' v1 has no strings for locale 'de'"),
        ({"locale": "??"}, r"--locale '\?\?' is not a language tag"),
    ],
)
def test_what_is_unknown_is_refused_naming_it(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        preview(NTYPE, "t", Settings(), **kwargs)


def test_an_unknown_type() -> None:
    with pytest.raises(UnknownType, match=r"^unknown notification type 'nope'$"):
        preview(None, "nope", Settings())
