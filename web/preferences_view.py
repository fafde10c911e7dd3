"""What the preferences page shows and what its form means, apart from HTTP (web/preferences.py).

`groups()` turns the recipient's resolved preferences (tasks.preferences.get_preferences, the
function the API answers with) into one group per category, one row per type (titled with the
type's catalog `label`, else its key as words, and its `description`), one cell per channel a
recipient may choose (catalog RECIPIENT_CHANNELS: never console or webhook). `changes()` reads the posted form back into settings for set_preferences: only the cells
the recipient changed since the page was shown (each cell carries the state it was shown in), so
a save never re-asserts a default or undoes a change made elsewhere in between.

The words the recipient reads are here, in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clarion.catalog import CATEGORIES, Catalog, NotificationType
from clarion.catalog.model import readable
from clarion.gates import preferences as resolution

CATEGORY_TITLES = {
    "transactional": ("Receipts and account messages", "About things you did or asked for."),
    "security": ("Security", "Sign-in codes and warnings that protect your account."),
    "alert": ("Alerts", "Problems that need your attention."),
    "activation": ("Tips and reminders", "Nudges that help you make progress."),
    "digest": ("Summaries", "Round-ups of what happened."),
    "marketing": ("News and offers", "Product news, events and offers."),
}
CHANNEL_NAMES = {
    "email": "Email",
    "sms": "Text message (SMS)",
    "push": "Push notification",
    "in_app": "In the app",
    "slack": "Slack",
    "teams": "Microsoft Teams",
}
LOCKED_NOTE = (
    "Always sent: {what} cannot be turned off, not even by unsubscribing from everything, "
    "because you need them to use your account safely."
)
LOCKED_WHAT = {"transactional": "receipts and account messages", "security": "security messages"}
CRITICAL_NOTE = "Urgent: sent even during your quiet hours."
TITLE = "Your notification settings"
INTRO = "Choose where you get each kind of notification. Changes apply to the next one we send."
SAVE = "Save settings"
SAVED = "Saved. {n} setting{s} changed."
NOTHING_SAVED = "Saved. Nothing was changed."


@dataclass(frozen=True)
class Cell:
    value: str  # "type/channel", the checkbox's value
    id: str
    label: str
    enabled: bool
    locked: bool


@dataclass(frozen=True)
class Row:
    key: str
    title: str
    note: str | None
    note_id: str
    cells: list[Cell]
    description: str | None = None

    @property
    def described_by(self) -> str:
        """The ids of the row's description and note, for aria-describedby."""
        ids = [f"{self.note_id}-d" if self.description else "", self.note_id if self.note else ""]
        return " ".join(i for i in ids if i)


@dataclass(frozen=True)
class Group:
    category: str
    title: str
    blurb: str
    rows: list[Row]


class StaleForm(Exception):
    """The posted form names cells the catalog does not have (or may not change)."""


def _note(ntype: NotificationType) -> str | None:
    if resolution.locked(ntype):
        return LOCKED_NOTE.format(
            what=LOCKED_WHAT.get(ntype.category, f"{ntype.category} messages")
        )
    return CRITICAL_NOTE if ntype.critical else None


def groups(catalog: Catalog, resolved: Mapping[str, Any], locale: str | None = None) -> list[Group]:
    """The page's groups for `resolved` (get_preferences' answer), categories in catalog order;
    a type with no channel a recipient may choose has no row."""
    found, n = [], 0
    for category in CATEGORIES:
        rows = []
        for ntype in sorted(
            (t for t in catalog.types.values() if t.category == category),
            key=lambda t: (t.label(locale).casefold(), t.key),  # in the order a person reads
        ):
            states = resolved["types"].get(ntype.key)  # None: added to the catalog just now
            if states is None or not ntype.recipient_channels:
                continue
            cells = []
            for channel in ntype.recipient_channels:
                n += 1
                cells.append(
                    Cell(
                        value=f"{ntype.key}/{channel}",
                        id=f"c{n}",
                        label=CHANNEL_NAMES.get(channel, readable(channel)),
                        enabled=bool(states[channel]["enabled"]),
                        locked=resolution.locked(ntype),
                    )
                )
            title, about = ntype.label(locale), ntype.description(locale)
            rows.append(Row(ntype.key, title, _note(ntype), f"n{n}", cells, about))
        if rows:
            title, blurb = CATEGORY_TITLES[category]
            found.append(Group(category, title, blurb, rows))
    return found


def shown_state(cell: Cell) -> str:
    """The hidden `was` field of a cell: what the page showed, so a save sends only changes."""
    return f"{cell.value}:{int(cell.enabled)}"


def changes(catalog: Catalog, form: Mapping[str, list[str]]) -> dict[str, bool]:
    """Settings for set_preferences: `type:<key>/<channel>` for each cell the recipient changed."""
    shown: dict[str, bool] = {}
    for item in form.get("was", []):
        value, _, state = item.rpartition(":")
        if state not in ("0", "1") or value in shown:
            raise StaleForm(f"bad was field {item[:80]!r}")
        _editable(catalog, value)
        shown[value] = state == "1"
    checked = set(form.get("on", []))
    if not checked <= shown.keys():
        raise StaleForm("a checked box the page did not show")
    return {
        f"type:{value}": value in checked
        for value, was in shown.items()
        if (value in checked) != was
    }


def _editable(catalog: Catalog, value: str) -> None:
    key, _, channel = value.rpartition("/")
    ntype = catalog.get(key)
    if ntype is None or channel not in ntype.recipient_channels or resolution.locked(ntype):
        raise StaleForm(f"{value[:80]!r} is not a setting the page offers")
