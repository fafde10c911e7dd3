"""Set-up shared by the benchmark scripts: where the services are, and a fresh database name."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[1]


def say(msg: str) -> None:
    print(msg, flush=True)


def with_database(url: str, name: str) -> str:
    """The same server URL, naming another database."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def start_services(name: str):
    """(database URL, handle to stop or None): CLARION_DATABASE_URL, else embedded services of our own."""
    url = os.environ.get("CLARION_DATABASE_URL")
    if url:
        return url, None
    from clarion.db.embedded import ensure_running

    handle = ensure_running(ROOT / ".clarion" / f"bench-{name}")
    return handle.database_url, handle


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: first column left-aligned, the figures right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])
