"""Per-locale strings in templates (catalog/locales.py, catalog/model.py): tag spelling, the
fallback chain, which locale each field comes from, and what the catalog refuses at load."""

from __future__ import annotations

from typing import Any

import pytest

from clarion.catalog import Catalog, CatalogError
from clarion.catalog.locales import chain, normalise


@pytest.mark.parametrize(
    ("tag", "canonical"),
    [
        ("en", "en"),
        ("EN", "en"),
        ("de-AT", "de-AT"),
        ("de_at", "de-AT"),
        ("DE_at", "de-AT"),
        ("zh_hant_tw", "zh-Hant-TW"),
        ("sr-latn", "sr-Latn"),
        ("es-419", "es-419"),
        ("fil", "fil"),
        ("en-US-x-TWAIN", "en-US-x-twain"),  # after a singleton: lower case, no region rule
        (" fr-ca ", "fr-CA"),
    ],
)
def test_normalise_spells_every_tag_one_way(tag: str, canonical: str) -> None:
    assert normalise(tag) == canonical


@pytest.mark.parametrize(
    "tag",
    ["", "e", "english", "de-", "-AT", "de--AT", "ü", "de-AT!", "d3", None, 7, "en-" + "x" * 40],
)
def test_normalise_refuses_what_is_not_a_tag(tag: Any) -> None:
    assert normalise(tag) is None


@pytest.mark.parametrize(
    ("tag", "default", "expected"),
    [
        ("de-AT", "en", ("de-AT", "de", "en")),
        ("de_at", "en", ("de-AT", "de", "en")),
        ("de", "en", ("de", "en")),
        ("en", "en", ("en",)),
        ("en-GB", "en", ("en-GB", "en")),
        ("zh-Hant-TW", "fr", ("zh-Hant-TW", "zh-Hant", "zh", "fr")),
        ("en-US-x-twain", "en", ("en-US-x-twain", "en-US", "en")),  # never ends on a singleton
        (None, "en", ("en",)),
        ("not a tag", "de", ("de",)),
    ],
)
def test_the_fallback_chain(tag: Any, default: str, expected: tuple[str, ...]) -> None:
    assert chain(tag, default) == expected


def _catalog(template: dict[str, Any], **top: Any) -> Catalog:
    spec = {
        "category": "transactional",
        "channels": ["webhook", "sms"],
        "required": ["name"],
        "templates": [{"version": 1, **template}],
    }
    return Catalog.from_dict({"types": {"t": spec}, **top}, "cat.yaml")


LOCALISED = {
    "title": "Hello {{ name }}",
    "body": "Your order is late.",
    "channels": {"sms": {"body": "Late order, {{ name }}."}},
    "locales": {
        "de": {"title": "Hallo {{ name }}", "body": "Deine Bestellung ist spät."},
        "de_at": {"title": "Servus {{ name }}"},  # written with "_": found as de-AT
        "fr": {
            "title": "Bonjour {{ name }}",
            "channels": {"sms": {"body": "Commande en retard, {{ name }}."}},
        },
    },
}


@pytest.mark.parametrize(
    ("locale", "channel", "expected", "used"),
    [
        (None, "webhook", {"title": "Hello Ann", "body": "Your order is late."}, "en"),
        ("en", "sms", {"title": "Hello Ann", "body": "Late order, Ann."}, "en"),
        ("de", "webhook", {"title": "Hallo Ann", "body": "Deine Bestellung ist spät."}, "de"),
        # a locale's own field beats the default locale's channel override (no English in German)
        ("de", "sms", {"title": "Hallo Ann", "body": "Deine Bestellung ist spät."}, "de"),
        # de-AT has only a title: the body falls back to de, field by field
        (
            "de-AT",
            "webhook",
            {"title": "Servus Ann", "body": "Deine Bestellung ist spät."},
            "de-AT",
        ),
        (
            "DE_at",
            "webhook",
            {"title": "Servus Ann", "body": "Deine Bestellung ist spät."},
            "de-AT",
        ),
        ("de-CH", "webhook", {"title": "Hallo Ann", "body": "Deine Bestellung ist spät."}, "de"),
        # fr has no body of its own: the default locale's; but its sms override wins on sms
        ("fr", "webhook", {"title": "Bonjour Ann", "body": "Your order is late."}, "fr"),
        ("fr-CA", "sms", {"title": "Bonjour Ann", "body": "Commande en retard, Ann."}, "fr"),
        ("ja", "webhook", {"title": "Hello Ann", "body": "Your order is late."}, "en"),
        ("junk!", "webhook", {"title": "Hello Ann", "body": "Your order is late."}, "en"),
    ],
)
def test_each_field_comes_from_the_most_specific_locale_that_has_it(
    locale: str | None, channel: str, expected: dict[str, str], used: str
) -> None:
    ntype = _catalog(LOCALISED).types["t"]
    assert ntype.render(1, channel, {"name": "Ann"}, locale) == expected
    assert ntype.locale_for(1, locale) == used


def test_the_default_locale_is_configurable() -> None:
    catalog = _catalog(
        {"body": "Bonjour {{ name }}", "locales": {"en": {"body": "Hello {{ name }}"}}},
        locale="FR",
    )
    assert catalog.locale == "fr"
    ntype = catalog.types["t"]
    assert ntype.default_locale == "fr"
    assert ntype.render(1, "webhook", {"name": "A"}, "en-GB") == {"body": "Hello A"}
    assert ntype.render(1, "webhook", {"name": "A"}, "de") == {"body": "Bonjour A"}
    assert ntype.render(1, "webhook", {"name": "A"}) == {"body": "Bonjour A"}


def test_a_catalog_without_locales_renders_as_before() -> None:
    ntype = _catalog({"body": "Hi {{ name }}"}).types["t"]
    assert ntype.render(1, "webhook", {"name": "A"}, "de-AT") == {"body": "Hi A"}
    assert ntype.locale_for(1, "de-AT") == "en"


@pytest.mark.parametrize(
    ("template", "top", "message"),
    [
        (
            {"body": "x", "locales": {"de_AT!": {"body": "y"}}},
            {},
            r"cat.yaml: type 't': template v1 locales: 'de_AT!' is not a language tag",
        ),
        (
            {"body": "x", "locales": {"de-AT": {"body": "y"}, "de_at": {"body": "z"}}},
            {},
            r"template v1 locales: 'de_at' is given twice \(as 'de-AT'\)",
        ),
        (
            {"body": "x", "locales": {"EN": {"body": "y"}}},
            {},
            r"locales: 'EN' is the catalog's default locale",
        ),
        (
            {"body": "x", "locales": ["de"]},
            {},
            r"template v1: locales must map a locale tag",
        ),
        (
            {"body": "x", "locales": {"de": "Hallo"}},
            {},
            r"template v1 locale de: must be a mapping",
        ),
        (
            {"body": "x", "locales": {"de": {"body": ["a"]}}},
            {},
            r"template v1 locale de\.body must be text",
        ),
        (
            {"body": "x", "locales": {"de": {"channels": {"smss": {"body": "y"}}}}},
            {},
            r"template v1 locale de channels: unknown channel 'smss'; did you mean 'sms'\?",
        ),
        (
            {"body": "x", "locales": {"de": {"body": "{{ nme }}"}}},
            {},
            r"template v1 uses nme, which are neither required nor given defaults",
        ),
        (
            {"body": "x", "locales": {"de": {"body": "{{ name | nope }}"}}},
            {},
            r"type 't' v1 locale 'de' channel 'sms' field 'body': unknown filter 'nope'",
        ),
        (
            {
                "body": "x",
                "locales": {"fr": {"channels": {"sms": {"body": "{{ name.x.y() + 1 }}"}}}},
            },
            {},
            r"type 't' v1 locale 'fr' channel 'sms' field 'body': cannot render",
        ),
        ({"body": "x"}, {"locale": "en_US!"}, r"cat.yaml: locale must be a language tag"),
    ],
)
def test_bad_locale_variants_are_refused_at_load_naming_the_place(
    template: dict[str, Any], top: dict[str, Any], message: str
) -> None:
    with pytest.raises(CatalogError, match=message):
        _catalog(template, **top)


def test_the_load_time_check_renders_every_locale_with_the_versions_samples() -> None:
    """A locale variant that only breaks with the declared samples fails at load, in that locale."""
    template = {
        "body": "{{ name }}",
        "samples": {"name": "Ann"},
        "locales": {"de": {"body": "{{ name.upper() }} {{ 1 / (name | length - 3) }}"}},
    }
    with pytest.raises(CatalogError, match=r"v1 locale 'de' channel '(sms|webhook)' field 'body'"):
        _catalog(template)


def test_variables_and_targets_cover_every_locale() -> None:
    template = _catalog(LOCALISED).types["t"].templates[1]
    assert template.variables() == {"name"}
    assert {t[0] for t in template.targets(("webhook",))} == {"en", "de", "de-AT", "fr"}
    assert set(template.locales) == {"de", "de-AT", "fr"}


def test_a_python_built_catalog_is_checked_for_canonical_locale_keys() -> None:
    from clarion.catalog import NotificationType, Strings, Template

    def built(tag: str) -> Catalog:
        template = Template(1, {"body": "x"}, locales={tag: Strings({"body": "y"})})
        ntype = NotificationType("t", "transactional", "transactional", ("webhook",), {1: template})
        return Catalog({"t": ntype}, "app:CATALOG")

    assert built("de-AT").check().types["t"].render(1, "webhook", {}, "de_at") == {"body": "y"}
    for bad in ("de_AT", "en"):
        with pytest.raises(CatalogError, match=rf"app:CATALOG: type 't' v1 locales: '{bad}'"):
            built(bad).check()
