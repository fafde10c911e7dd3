"""Flushing digests: the route of a digest request first closes its window and fills it in.

Called at the start of the route transaction, before resolve-once, so the lock order is the one an
item joining the window takes (the window row, then the digest request row): an item and the flush
meeting on one window wait for each other rather than deadlock. Of two routes of one digest
request, one closes the window; the other finds it closed and, after the first commits, the
request routed. The summary line is made here, within the summariser's deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from catalog import Catalog
from catalog.digest import DigestSpec, render_fallback
from clarion.errors import ConfigurationError
from db import digests
from db.ledger import Key
from tasks.summarise import SummaryRequest, resolve, summary_line

log = logging.getLogger(__name__)


def close_windows(conn: Connection, keys: Iterable[Key], catalog: Catalog, *, now: datetime) -> int:
    """Close the digest windows of the digest requests among `keys` and write each one's variables
    (items, count, summary) on its request. Returns how many windows were closed."""
    closed = digests.close(conn, keys, now=now)
    for window in closed:
        variables = digest_variables(window, spec_for(catalog, window))
        digests.store_variables(conn, (window.user_id, window.request_id), variables)
        log.info(
            "digest closed",
            extra={
                "action": "digest_closed",
                "digest_type": window.digest_type,
                "items": len(window.items),
                "summary_source": variables["summary_source"],
            },
        )
    return len(closed)


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
