"""A type's `label` and `description` (with locales) in the catalog, and what the preferences
page makes of them: titles from labels (else the key as words), cells only for the channels a
recipient may choose (RECIPIENT_CHANNELS)."""

from __future__ import annotations

from typing import Any

import pytest

from clarion.catalog import RECIPIENT_CHANNELS, Catalog, CatalogError
from clarion.web import preferences_view as view


def catalog(**extra: Any) -> Catalog:
    return Catalog.from_dict(
        {
            "types": {
                "load_evt": {
                    "category": "activation",
                    "channels": ["email", "webhook", "console", "in_app"],
                    "templates": [{"version": 1, "body": "b"}],
                    **extra,
                },
                "sec_code": {
                    "category": "alert",
                    "channels": ["sms", "webhook"],
                    "templates": [{"version": 1, "body": "b"}],
                },
                "hook_only": {
                    "category": "alert",
                    "channels": ["webhook", "console"],
                    "templates": [{"version": 1, "body": "b"}],
                },
            }
        },
        "cat.yaml",
    )


LABELLED = {
    "label": "Your first load",
    "description": "A nudge when your data has not loaded yet.",
    "locales": {"de": {"label": "Dein erster Import"}, "fr_ca": {"description": "Un rappel."}},
}


def test_labels_and_descriptions_follow_the_locale_chain() -> None:
    ntype = catalog(**LABELLED).types["load_evt"]
    assert ntype.label() == ntype.label("en-GB") == "Your first load"
    assert ntype.label("de-AT") == "Dein erster Import"
    assert ntype.description("de") == "A nudge when your data has not loaded yet."  # field by field
    assert ntype.description("fr-CA") == "Un rappel." and ntype.label("fr-CA") == "Your first load"


def test_a_type_without_a_label_reads_as_words() -> None:
    ntype = catalog().types["sec_code"]
    assert ntype.label() == "Sec code" and ntype.description() is None


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"label": ""}, "label must be text of 1-80 characters, not ''"),
        ({"label": "x" * 81}, "label must be text of 1-80 characters"),
        ({"label": ["a"]}, "label must be text"),
        ({"description": "x" * 301}, "description must be text of 1-300 characters"),
        ({"locales": ["de"]}, "locales must map a language tag"),
        ({"locales": {"en": {"label": "x"}}}, "other than the default locale 'en'"),
        ({"locales": {"not a tag": {"label": "x"}}}, "'not a tag' must be a language tag"),
        ({"locales": {"de": {"title": "x"}}}, "locales de: only label and description"),
        ({"locales": {"de": {"label": 3}}}, "locales de label must be text"),
    ],
)
def test_bad_labels_are_refused_naming_file_type_and_field(extra, words) -> None:
    with pytest.raises(CatalogError, match="^cat.yaml: type 'load_evt': ") as caught:
        catalog(**extra)
    assert words in str(caught.value)


def test_the_page_titles_types_with_labels_and_offers_only_recipient_channels() -> None:
    cat = catalog(**LABELLED)
    resolved = {
        "types": {t.key: {c: {"enabled": True} for c in t.channels} for t in cat.types.values()}
    }
    rows = {r.key: r for g in view.groups(cat, resolved) for r in g.rows}
    assert set(rows) == {"load_evt", "sec_code"}  # hook_only has nothing a recipient may choose
    assert rows["load_evt"].title == "Your first load"
    assert rows["load_evt"].description == "A nudge when your data has not loaded yet."
    assert [c.value for c in rows["load_evt"].cells] == ["load_evt/email", "load_evt/in_app"]
    assert rows["sec_code"].title == "Sec code" and rows["sec_code"].description is None
    assert {c.value.split("/")[1] for r in rows.values() for c in r.cells} <= RECIPIENT_CHANNELS
    assert rows["load_evt"].described_by == f"{rows['load_evt'].note_id}-d"
    de = {r.key: r.title for g in view.groups(cat, resolved, "de") for r in g.rows}
    assert de["load_evt"] == "Dein erster Import"


def test_a_posted_internal_channel_is_refused_as_stale() -> None:
    with pytest.raises(view.StaleForm, match="'load_evt/webhook' is not a setting the page offers"):
        view.changes(catalog(), {"was": ["load_evt/webhook:1"]})
