"""Plain-text tables a person can read in a terminal."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def render(
    headers: Sequence[str], rows: Iterable[Sequence[object]], title: str | None = None
) -> str:
    cells = [[str(c) for c in headers]] + [
        ["" if c is None else str(c) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        all(r[i].lstrip("-").isdigit() for r in cells[1:] if r[i]) for i in range(len(headers))
    ]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(row, widths, numeric, strict=True)
        ).rstrip()

    out = [title] if title else []
    out += [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]] or ["(none)"]
    return "\n".join(out)
