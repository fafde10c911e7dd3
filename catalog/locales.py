"""Locale tags as templates use them: one spelling per tag, and the fallback chain a recipient's
locale is rendered through (`de-AT → de → en`, the catalog's default last).

Tags are BCP 47 language tags. `normalise` accepts the spellings people write (`de_at`, `EN`,
`zh_hant_tw`) and gives the canonical case: language lower, script title (`Hant`), region upper
(`AT`, `419`), anything after a singleton (`-u-`, `-x-`) lower.
"""

from __future__ import annotations

import re

DEFAULT = "en"
_TAG = re.compile(r"[a-z]{2,3}(-[a-z0-9]{1,8})*")
MAX_CHARS = 35


def normalise(tag: object) -> str | None:
    """The canonical spelling of a language tag, or None for something that is not one."""
    if not isinstance(tag, str) or not tag.isascii() or len(tag) > MAX_CHARS:
        return None
    lowered = tag.strip().replace("_", "-").lower()
    if not _TAG.fullmatch(lowered):
        return None
    parts = lowered.split("-")
    out = [parts[0]]
    private = False
    for part in parts[1:]:
        if len(part) == 1:
            private = True  # an extension or private use: the rest keeps lower case
        if private:
            out.append(part)
        elif len(part) == 4 and part.isalpha():
            out.append(part.title())
        elif (len(part) == 2 and part.isalpha()) or (len(part) == 3 and part.isdigit()):
            out.append(part.upper())
        else:
            out.append(part)
    return "-".join(out)


def chain(tag: object, default: str = DEFAULT) -> tuple[str, ...]:
    """The locales to look in, most specific first: the tag, each shorter prefix of it, then the
    default. A missing or malformed tag is just the default. `chain("de_AT") == ("de-AT", "de",
    "en")`; `chain("zh-Hant-TW", "fr") == ("zh-Hant-TW", "zh-Hant", "zh", "fr")`."""
    canonical = normalise(tag)
    parts = canonical.split("-") if canonical else []
    found: list[str] = []
    for n in range(len(parts), 0, -1):
        if len(parts[n - 1]) == 1:  # never end a prefix on a singleton (`de-x`)
            continue
        found.append("-".join(parts[:n]))
    if default not in found:
        found.append(default)
    return tuple(found)
