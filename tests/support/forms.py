"""An HTML form read as a browser submits it (the preferences page's), for tests of pages."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from html.parser import HTMLParser


class Form(HTMLParser):
    """The page's form as a browser would submit it: hidden fields, checked boxes; and every
    checkbox with its label."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.fields: list[tuple[str, str]] = []
        self.boxes: dict[str, dict[str, str | None]] = {}
        self.labels: dict[str, str] = {}
        self._label: str | None = None
        self.action = ""
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self.action = a.get("action") or ""
        if tag == "input" and a.get("type") == "hidden":
            self.fields.append((a["name"] or "", a["value"] or ""))
        if tag == "input" and a.get("type") == "checkbox":
            self.boxes[a["id"] or ""] = a
        if tag == "label":
            self._label = a.get("for")
            self.labels[self._label or ""] = ""

    def handle_data(self, data: str) -> None:
        if self._label is not None:
            self.labels[self._label] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "label":
            self._label = None

    def submit(
        self, *, off: AbstractSet[str] = frozenset(), on: AbstractSet[str] = frozenset()
    ) -> list:
        """Fields to post, with the boxes whose value is in `off` unchecked and `on` checked."""
        checked = [
            ("on", b["value"])
            for b in self.boxes.values()
            if "disabled" not in b
            and b["value"] not in off
            and ("checked" in b or b["value"] in on)
        ]
        return self.fields + checked
