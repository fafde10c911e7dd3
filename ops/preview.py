"""`clarion preview`: what a recipient would get, built by the same code a delivery uses.

A preview renders a type's version in a locale (through its fallback chain), builds the adapter
Message with `Message.for_type` (as the deliver task does) and hands it to the channel's own
request builder (each adapter's `to_request` or the pure function its send uses): the email's
subject, text and HTML, Slack's Block Kit, the Teams Adaptive Card, the SMS body with its encoding
and segment count, the push payloads, the in-app item. Nothing is sent and nothing is written.
`clarion send --dry-run` shows the same renderings for a real recipient (`for_recipient`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from clarion.catalog import NotificationType
from clarion.catalog import locales as catalog_locales
from clarion.errors import InvalidRequest, SendError, UnknownType
from clarion.ops.preview_channels import BUILDERS, generic
from clarion.ops.table import render as table
from clarion.records import Message
from clarion.rows import Recipient
from clarion.settings import Settings

if TYPE_CHECKING:
    from clarion.gates.contract import Plan

PREVIEW_USER = "preview-user"
PREVIEW_OCCURRENCE = "preview"
# Where a preview without a recipient "sends": placeholders in each channel's address format.
PLACEHOLDER_ADDRESSES = {
    "email": "recipient@example.com",
    "slack": "U0PREVIEW",
    "teams": "29:preview",
    "sms": "+15555550100",
    "push": "fcm:preview-device-token-0001 apns:" + "ab" * 32,
    "webhook": "https://receiver.example/hook",
}


@dataclass(frozen=True)
class Rendering:
    """One channel's preview: the rendered fields and the provider request built from them."""

    type_key: str
    version: int
    channel: str
    locale: str  # the locale whose strings were used (after the fallback chain)
    chain: tuple[str, ...]  # the locales the fields came from, most specific first
    asked: str | None  # the locale asked for (the recipient's, or --locale)
    content: dict[str, str]
    request: dict[str, Any]  # the provider request, as JSON
    lines: list[tuple[str, str]] = field(default_factory=list)  # (what, value) to show a person
    error: str | None = None  # the adapter refused the message (e.g. no address): would fail

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "lines"}


def _pick_version(ntype: NotificationType, version: int | None) -> int:
    if version is None:
        return ntype.version
    if version not in ntype.templates:
        known = ", ".join(str(v) for v in sorted(ntype.templates))
        raise InvalidRequest(f"type {ntype.key!r} has no version {version} (it has: {known})")
    return version


def _pick_channels(ntype: NotificationType, version: int, channel: str | None) -> list[str]:
    known = sorted(set(ntype.channels) | ntype.templates[version].channels_overridden())
    if channel is None:
        return list(ntype.channels)
    if channel not in known:
        raise InvalidRequest(
            f"type {ntype.key!r} has no channel {channel!r} (it has: {', '.join(known)})"
        )
    return [channel]


def check_locale(ntype: NotificationType, version: int, locale: str) -> str:
    """A --locale the version has strings for (itself or a shorter prefix; the catalog default
    counts): the canonical tag. Anything else is an InvalidRequest naming it."""
    canonical = catalog_locales.normalise(locale)
    if canonical is None:
        raise InvalidRequest(f"--locale {locale!r} is not a language tag such as 'de' or 'de-AT'")
    template = ntype.templates[version]
    prefixes = [
        t
        for t in catalog_locales.chain(canonical, ntype.default_locale)
        if canonical == t or canonical.startswith(t + "-")
    ]
    if not any(t == ntype.default_locale or t in template.locales for t in prefixes):
        have = ", ".join([ntype.default_locale, *sorted(template.locales)])
        raise InvalidRequest(
            f"type {ntype.key!r} v{version} has no strings for locale {locale!r} (it has: {have})"
        )
    return canonical


def preview(
    ntype: NotificationType | None,
    type_key: str,
    settings: Settings,
    *,
    version: int | None = None,
    channel: str | None = None,
    locale: str | None = None,
    variables: Mapping[str, Any] | None = None,
) -> list[Rendering]:
    """Every asked channel of `type_key` rendered with the version's samples (over the type's),
    `variables` on top, as a placeholder recipient would get it."""
    if ntype is None:
        raise UnknownType(type_key)
    pinned = _pick_version(ntype, version)
    asked = check_locale(ntype, pinned, locale) if locale is not None else None
    context = {**ntype.sample_variables(pinned), **(variables or {})}
    return [
        render_channel(
            ntype,
            pinned,
            c,
            context,
            asked,
            settings,
            user_id=PREVIEW_USER,
            address=PLACEHOLDER_ADDRESSES.get(c),
        )
        for c in _pick_channels(ntype, pinned, channel)
    ]


def for_recipient(
    ntype: NotificationType,
    recipient: Recipient,
    channels: list[str],
    variables: Mapping[str, Any],
    settings: Settings,
    *,
    occurrence_key: str,
) -> list[Rendering]:
    """What `recipient` would get on `channels` for a new request (the latest version, the
    recipient's locale and addresses): the rendering `clarion send --dry-run` shows."""
    return [
        render_channel(
            ntype,
            ntype.version,
            c,
            dict(variables),
            recipient.locale,
            settings,
            user_id=recipient.user_id,
            address=recipient.addresses.get(c),
            occurrence_key=occurrence_key,
        )
        for c in channels
    ]


def render_channel(
    ntype: NotificationType,
    version: int,
    channel: str,
    variables: dict[str, Any],
    locale: str | None,
    settings: Settings,
    *,
    user_id: str,
    address: str | None,
    occurrence_key: str = PREVIEW_OCCURRENCE,
) -> Rendering:
    """Render one channel as the deliver task does, and build its provider request."""
    try:
        content = ntype.render(version, channel, variables, locale)
    except Exception as exc:  # what a delivery would record as render_failed
        raise InvalidRequest(f"type {ntype.key!r} v{version} does not render: {exc}") from exc
    message = Message.for_type(
        ntype,
        version,
        channel,
        content,
        variables,
        delivery_id=0,
        user_id=user_id,
        occurrence_key=occurrence_key,
        address=address,
    )
    request: dict[str, Any] = {}
    lines: list[tuple[str, str]] = []
    error = None
    try:
        request, lines = BUILDERS.get(channel, generic)(message, settings)
    except SendError as refused:  # the adapter would refuse it: shown, not raised
        error = f"{refused.reason}: {refused.detail}"
    return Rendering(
        ntype.key,
        version,
        channel,
        ntype.locale_for(version, locale),
        _chain(ntype, version, locale),
        locale,
        content,
        request,
        lines,
        error,
    )


def _chain(ntype: NotificationType, version: int, locale: str | None) -> tuple[str, ...]:
    template = ntype.templates[version]
    default = ntype.default_locale
    return tuple(
        t for t in catalog_locales.chain(locale, default) if t == default or t in template.locales
    )


# --- output ------------------------------------------------------------------------------------


def readable(renderings: list[Rendering]) -> str:
    """One small table per channel; a multi-line value continues on the next rows."""
    out = []
    for r in renderings:
        asked = f" (asked {r.asked})" if r.asked and r.asked != r.locale else ""
        where = "locale " + " → ".join(r.chain) + asked
        title = f"{r.channel} — {r.type_key} v{r.version}, {where}"
        if r.error:
            out.append(f"{title}\n  would fail: {r.error}")
            continue
        rows: list[tuple[str, str]] = []
        for what, value in r.lines:
            first, *rest = str(value).split("\n") or [""]
            rows.append((what, first))
            rows += [("", line) for line in rest]
        out.append(table(["field", "value"], rows, title))
    return "\n\n".join(out)


def as_json(renderings: list[Rendering]) -> str:
    return json.dumps([r.to_json() for r in renderings], ensure_ascii=False, indent=2)


def dry_run_renderings(
    user_id: str,
    type_key: str,
    plan: Plan,
    variables: Mapping[str, Any],
    *,
    event_id: str | None = None,
    occurrence_key: str | None = None,
) -> str:
    """The renderings under `clarion send --dry-run`'s plan: each channel the plan would deliver
    on, for the real recipient (their locale and address). Empty when it delivers on none."""
    from clarion import settings
    from clarion import validation as check
    from clarion.db import ledger
    from clarion.db.engine import engine
    from clarion.tasks import runtime

    ntype = runtime.catalog().get(type_key)
    channels = [c for c, _ in plan.channels]
    if ntype is None or not channels:
        return ""
    with engine().connect() as conn:
        recipient = ledger.recipients(conn, [user_id])[user_id]
    renderings = for_recipient(
        ntype,
        recipient,
        channels,
        variables,
        settings.get(),
        occurrence_key=check.occurrence_key(event_id, occurrence_key),
    )
    return readable(renderings)


def run(
    type_key: str,
    *,
    version: int | None,
    channel: str | None,
    locale: str | None,
    variables: Mapping[str, Any],
    json_out: bool,
) -> str:
    """The `clarion preview` command's output (ClarionError for anything unknown)."""
    from clarion import settings
    from clarion.tasks import runtime

    catalog = runtime.catalog()
    if catalog.get(type_key) is None:
        raise UnknownType(type_key, catalog.name)
    renderings = preview(
        catalog.get(type_key),
        type_key,
        settings.get(),
        version=version,
        channel=channel,
        locale=locale,
        variables=variables,
    )
    return as_json(renderings) if json_out else readable(renderings)
