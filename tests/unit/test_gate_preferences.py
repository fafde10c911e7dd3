"""gates/preferences.py: one answer per (type, channel) and the rule that decided it.

Precedence, strongest first: locked > per-type > per-category > all > type default > category
default; at each recipient level the channel-specific setting beats the '*' one.
"""

from __future__ import annotations

from typing import Any

import pytest

from clarion.catalog import Catalog, NotificationType
from clarion.gates.preferences import Resolution, category_default, resolve
from clarion.rows import Preference

OFF, ON = False, True


def ntype(category: str, key: str = "t", default: Any = None) -> NotificationType:
    spec: dict[str, Any] = {
        "category": category,
        "channels": ["email", "sms"],
        "templates": [{"version": 1, "body": "hello"}],
    }
    if default is not None:
        spec["options"] = {"default": default}
    built = Catalog.from_dict({"types": {key: spec}}).get(key)
    assert built is not None
    return built


def src_type(key: str, where: str) -> str:
    return f"recipient setting: type {key} on {where}"


def src_category(category: str, where: str) -> str:
    return f"recipient setting: category {category} on {where}"


def src_all(where: str) -> str:
    return f"recipient setting: all notifications on {where}"


EVERYTHING_OFF: tuple[Preference, ...] = (
    Preference("type", "t", "email", OFF),
    Preference("type", "t", "*", OFF),
    Preference("category", "transactional", "*", OFF),
    Preference("category", "security", "*", OFF),
    Preference("category", "transactional", "email", OFF),
    Preference("category", "security", "email", OFF),
    Preference("all", "*", "email", OFF),
    Preference("all", "*", "*", OFF),
)


# (category, options.default, preferences, channel, country) -> (enabled, source)
CASES = [
    # --- 1. locked ------------------------------------------------------------------------------
    pytest.param(
        "transactional",
        None,
        EVERYTHING_OFF,
        "email",
        "US",
        True,
        "locked (transactional)",
        id="locked-transactional-everything-off",
    ),
    pytest.param(
        "security",
        None,
        EVERYTHING_OFF,
        "email",
        "DE",
        True,
        "locked (security)",
        id="locked-security-everything-off",
    ),
    pytest.param(
        "transactional",
        None,
        (Preference("all", "*", "*", OFF),),
        "sms",
        None,
        True,
        "locked (transactional)",
        id="locked-transactional-unsubscribe-all",
    ),
    pytest.param(
        "security",
        "off",
        (),
        "email",
        None,
        True,
        "locked (security)",
        id="locked-beats-type-default-off",
    ),
    # --- 2. per-type ----------------------------------------------------------------------------
    pytest.param(
        "alert",
        None,
        (Preference("type", "t", "email", OFF), Preference("type", "t", "*", ON)),
        "email",
        None,
        False,
        src_type("t", "email"),
        id="type-channel-beats-type-star",
    ),
    pytest.param(
        "alert",
        None,
        (Preference("type", "t", "email", ON), Preference("type", "t", "*", OFF)),
        "email",
        None,
        True,
        src_type("t", "email"),
        id="type-channel-on-beats-type-star-off",
    ),
    pytest.param(
        "alert",
        None,
        (Preference("type", "t", "*", OFF),),
        "sms",
        None,
        False,
        src_type("t", "every channel"),
        id="type-star-applies-to-any-channel",
    ),
    pytest.param(
        "alert",
        None,
        (Preference("type", "t", "email", OFF),),
        "sms",
        None,
        True,
        "category default",
        id="type-email-does-not-touch-sms",
    ),
    pytest.param(
        "alert",
        None,
        (Preference("type", "t", "*", ON), Preference("category", "alert", "email", OFF)),
        "email",
        None,
        True,
        src_type("t", "every channel"),
        id="type-star-beats-category-channel",
    ),
    pytest.param(
        "alert",
        None,
        (Preference("type", "t", "email", ON), Preference("all", "*", "email", OFF)),
        "email",
        None,
        True,
        src_type("t", "email"),
        id="type-beats-all",
    ),
    pytest.param(
        "marketing",
        None,
        (Preference("type", "t", "*", ON),),
        "email",
        "DE",
        True,
        src_type("t", "every channel"),
        id="type-on-beats-marketing-opt-in",
    ),
    pytest.param(
        "alert",
        "off",
        (Preference("type", "t", "sms", ON),),
        "sms",
        None,
        True,
        src_type("t", "sms"),
        id="type-beats-type-default",
    ),
    pytest.param(
        "alert",
        None,
        (Preference("type", "other", "*", OFF),),
        "email",
        None,
        True,
        "category default",
        id="another-types-setting-ignored",
    ),
    # --- 3. per-category ------------------------------------------------------------------------
    pytest.param(
        "alert",
        None,
        (Preference("category", "alert", "email", OFF), Preference("category", "alert", "*", ON)),
        "email",
        None,
        False,
        src_category("alert", "email"),
        id="category-channel-beats-category-star",
    ),
    pytest.param(
        "alert",
        None,
        (Preference("category", "alert", "*", OFF), Preference("all", "*", "email", ON)),
        "email",
        None,
        False,
        src_category("alert", "every channel"),
        id="category-star-beats-all-channel",
    ),
    pytest.param(
        "activation",
        None,
        (Preference("category", "activation", "sms", ON), Preference("all", "*", "*", OFF)),
        "sms",
        None,
        True,
        src_category("activation", "sms"),
        id="category-on-beats-all-off",
    ),
    pytest.param(
        "marketing",
        None,
        (Preference("category", "marketing", "*", OFF),),
        "email",
        "US",
        False,
        src_category("marketing", "every channel"),
        id="category-off-beats-marketing-opt-out",
    ),
    pytest.param(
        "alert",
        None,
        (Preference("category", "marketing", "*", OFF),),
        "email",
        None,
        True,
        "category default",
        id="another-categorys-setting-ignored",
    ),
    pytest.param(
        "digest",
        "off",
        (Preference("category", "digest", "email", ON),),
        "email",
        None,
        True,
        src_category("digest", "email"),
        id="category-beats-type-default",
    ),
    # --- 4. all ---------------------------------------------------------------------------------
    pytest.param(
        "alert",
        None,
        (Preference("all", "*", "email", ON), Preference("all", "*", "*", OFF)),
        "email",
        None,
        True,
        src_all("email"),
        id="all-channel-beats-all-star",
    ),
    pytest.param(
        "alert",
        None,
        (Preference("all", "*", "email", ON), Preference("all", "*", "*", OFF)),
        "sms",
        None,
        False,
        src_all("every channel"),
        id="all-star-for-other-channel",
    ),
    pytest.param(
        "activation",
        None,
        (Preference("all", "*", "*", OFF),),
        "email",
        None,
        False,
        src_all("every channel"),
        id="unsubscribe-all-stops-activation",
    ),
    pytest.param(
        "marketing",
        None,
        (Preference("all", "*", "*", OFF),),
        "email",
        "US",
        False,
        src_all("every channel"),
        id="all-off-beats-us-opt-out-default",
    ),
    pytest.param(
        "marketing",
        None,
        (Preference("all", "*", "*", ON),),
        "sms",
        "DE",
        True,
        src_all("every channel"),
        id="all-on-beats-de-opt-in-default",
    ),
    pytest.param(
        "alert",
        "off",
        (Preference("all", "*", "*", ON),),
        "email",
        None,
        True,
        src_all("every channel"),
        id="all-beats-type-default",
    ),
    # --- 5. type default ------------------------------------------------------------------------
    pytest.param("alert", "off", (), "email", None, False, "type default", id="type-default-off"),
    pytest.param("alert", False, (), "email", None, False, "type default", id="type-default-false"),
    pytest.param(
        "marketing",
        "on",
        (),
        "email",
        "DE",
        True,
        "type default",
        id="type-default-on-beats-marketing-opt-in",
    ),
    pytest.param(
        "marketing",
        "off",
        (),
        "email",
        "US",
        False,
        "type default",
        id="type-default-off-beats-marketing-opt-out",
    ),
    pytest.param("alert", "on", (), "sms", None, True, "type default", id="type-default-on"),
    # --- 6. category default --------------------------------------------------------------------
    pytest.param("alert", None, (), "email", None, True, "category default", id="alert-default-on"),
    pytest.param(
        "activation", None, (), "sms", "DE", True, "category default", id="activation-default-on"
    ),
    pytest.param(
        "digest", None, (), "email", None, True, "category default", id="digest-default-on"
    ),
    pytest.param(
        "marketing",
        None,
        (),
        "email",
        "US",
        True,
        "category default (marketing is opt-out in US)",
        id="marketing-us-opt-out",
    ),
    pytest.param(
        "marketing",
        None,
        (),
        "sms",
        "DE",
        False,
        "category default (marketing is opt-in in DE)",
        id="marketing-de-opt-in",
    ),
    pytest.param(
        "marketing",
        None,
        (),
        "email",
        "GB",
        False,
        "category default (marketing is opt-in in GB)",
        id="marketing-gb-opt-in",
    ),
    pytest.param(
        "marketing",
        None,
        (),
        "email",
        "FR",
        False,
        "category default (marketing is opt-in in FR)",
        id="marketing-fr-opt-in",
    ),
    pytest.param(
        "marketing",
        None,
        (),
        "email",
        "IL",
        False,
        "category default (marketing is opt-in in IL)",
        id="marketing-il-opt-in",
    ),
    pytest.param(
        "marketing",
        None,
        (),
        "email",
        "CA",
        False,
        "category default (marketing is opt-in in CA)",
        id="marketing-ca-opt-in",
    ),
    pytest.param(
        "marketing",
        None,
        (),
        "email",
        None,
        False,
        "category default (marketing is opt-in in an unknown jurisdiction)",
        id="marketing-unknown-opt-in",
    ),
]


@pytest.mark.parametrize(
    ("category", "default", "prefs", "channel", "country", "enabled", "source"), CASES
)
def test_resolve_precedence(
    category: str,
    default: Any,
    prefs: tuple[Preference, ...],
    channel: str,
    country: str | None,
    enabled: bool,
    source: str,
) -> None:
    assert resolve(ntype(category, default=default), channel, prefs, country) == Resolution(
        enabled, source
    )


def test_resolve_accepts_any_iterable_of_preferences() -> None:
    prefs = (p for p in [Preference("category", "alert", "*", OFF)])
    assert resolve(ntype("alert"), "email", prefs, None) == Resolution(
        False, src_category("alert", "every channel")
    )


@pytest.mark.parametrize(
    ("category", "country", "expected"),
    [
        pytest.param(
            "marketing",
            "US",
            Resolution(True, "category default (marketing is opt-out in US)"),
            id="marketing-us",
        ),
        pytest.param(
            "marketing",
            "DE",
            Resolution(False, "category default (marketing is opt-in in DE)"),
            id="marketing-de",
        ),
        pytest.param(
            "marketing",
            None,
            Resolution(False, "category default (marketing is opt-in in an unknown jurisdiction)"),
            id="marketing-none",
        ),
        pytest.param("alert", None, Resolution(True, "category default"), id="alert"),
        pytest.param("digest", "DE", Resolution(True, "category default"), id="digest-de"),
    ],
)
def test_category_default(category: str, country: str | None, expected: Resolution) -> None:
    assert category_default(category, country) == expected
