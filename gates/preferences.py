"""Preference resolution: one answer per (type, channel), with the rule that decided it.

Precedence, strongest first:
  1. locked      transactional and security types always deliver ("unsubscribe all" included)
  2. per-type    the recipient's setting for this type (this channel, then every channel)
  3. per-category  the recipient's setting for the type's category (this channel, then every channel)
  4. all         the recipient's "unsubscribe all" / "subscribe all" (this channel, then every channel)
  5. type default  the type's `options.default`
  6. category default  on, except marketing, which is opt-in unless the recipient's jurisdiction
                 allows opt-out (the US); unknown jurisdictions are treated as opt-in
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from clarion.catalog import NotificationType
from clarion.rows import Preference

LOCKED_CATEGORIES = frozenset({"transactional", "security"})
MARKETING_OPT_OUT_COUNTRIES = frozenset({"US"})


@dataclass(frozen=True)
class Resolution:
    enabled: bool
    source: str  # which rule decided, for explain and the preferences page


def category_default(category: str, country: str | None) -> Resolution:
    if category == "marketing":
        if country in MARKETING_OPT_OUT_COUNTRIES:
            return Resolution(True, f"category default (marketing is opt-out in {country})")
        where = country or "an unknown jurisdiction"
        return Resolution(False, f"category default (marketing is opt-in in {where})")
    return Resolution(True, "category default")


def locked(ntype: NotificationType) -> bool:
    """Does `ntype` deliver whatever the recipient says (rule 1)? The preferences page shows these
    as fixed; the API refuses to turn them off."""
    return ntype.category in LOCKED_CATEGORIES


def resolve(
    ntype: NotificationType, channel: str, preferences: Iterable[Preference], country: str | None
) -> Resolution:
    """Whether `ntype` may go to this recipient on `channel`, and which rule said so."""
    if locked(ntype):
        return Resolution(True, f"locked ({ntype.category})")
    table = {(p.scope, p.key, p.channel): p.enabled for p in preferences}
    for scope, key in (("type", ntype.key), ("category", ntype.category), ("all", "*")):
        for ch in (channel, "*"):
            if (scope, key, ch) in table:
                where = "every channel" if ch == "*" else ch
                name = "all notifications" if scope == "all" else f"{scope} {key}"
                return Resolution(table[(scope, key, ch)], f"recipient setting: {name} on {where}")
    if ntype.default_on is not None:
        return Resolution(ntype.default_on, "type default")
    return category_default(ntype.category, country)
