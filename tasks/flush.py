"""Flushing digests: the route that resolved a digest request closes its window and fills it in.

Called in the route transaction right after resolve-once, so of two routes of one digest request
only the one that resolved it closes the window (db/digests.py has the lock order). The items,
count and summary line are written on the request, and handed to the planner in the request's
row. The summary line is made here, within the summariser's deadline.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from clarion.catalog import Catalog
from clarion.catalog.digest import DigestSpec, render_fallback
from clarion.db import digests
from clarion.errors import ConfigurationError
from clarion.rows import ResolvedRequest
from clarion.tasks.summarise import SummaryRequest, resolve, summary_line

log = logging.getLogger(__name__)


def close_windows(
    conn: Connection, resolved: list[ResolvedRequest], catalog: Catalog, *, now: datetime
) -> list[ResolvedRequest]:
    """Close the windows of the digest requests among `resolved` (just resolved in this
    transaction) and write each one's variables (items, count, summary) on its request row.
    Returns `resolved`, with those variables on the closed windows' requests."""
    keys = [r.key for r in resolved if r.occurrence_key.startswith("digest:")]
    closed = digests.close(conn, keys, now=now) if keys else []
    filled: dict[tuple[str, int], dict[str, Any]] = {}
    for window in closed:
        variables = digest_variables(window, spec_for(catalog, window))
        digests.store_variables(conn, (window.user_id, window.request_id), variables)
        filled[(window.user_id, window.request_id)] = variables
        log.info(
            "digest closed",
            extra={
                "action": "digest_closed",
                "digest_type": window.digest_type,
                "items": len(window.items),
                "summary_source": variables["summary_source"],
            },
        )
    if not filled:
        return resolved
    return [replace(r, variables=filled[r.key]) if r.key in filled else r for r in resolved]


def spec_for(catalog: Catalog, window: digests.Closed) -> DigestSpec:
    """The digest settings of the window's items' type (the first item's), else a default."""
    types = [window.items[0].get("type_key")] if window.items else []
    types += [t.key for t in catalog.types.values()]
    for key in types:
        ntype = catalog.get(str(key))
        if (
            ntype is not None
            and ntype.digest is not None
            and ntype.digest.type == window.digest_type
        ):
            return ntype.digest
    return DigestSpec(type=window.digest_type)


def digest_variables(window: digests.Closed, spec: DigestSpec) -> dict[str, Any]:
    """What the digest's templates render with: count, items, summary, first_at, last_at, types."""
    items = window.items
    context: dict[str, Any] = {
        "count": len(items),
        "items": items,
        "first_at": items[0].get("at") if items else None,
        "last_at": items[-1].get("at") if items else None,
        "types": sorted({str(i.get("type_key")) for i in items}),
    }
    fallback = render_fallback(spec, context)
    request = SummaryRequest(
        window.digest_type,
        len(items),
        tuple(items),
        fallback,
        spec.summary_max_chars,
        spec.summary_timeout,
        spec.model,
    )
    try:
        summariser = resolve(spec.summariser)
    except ConfigurationError:  # a digest is not held back by its summary line
        log.warning(
            "summariser %r unavailable",
            spec.summariser,
            exc_info=True,
            extra={"action": "digest_summariser_unavailable", "summariser": spec.summariser},
        )
        return {**context, "summary": fallback, "summary_source": "unavailable"}
    line, source = summary_line(summariser, request)
    return {**context, "summary": line, "summary_source": source}
