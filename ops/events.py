"""`clarion events`: apps' webhook endpoints for outbound events, and replay.

    clarion events endpoints add URL --kind delivery.bounced --kind delivery.failed
    clarion events endpoints list
    clarion events endpoints enable ID        (after a day of failures disabled it)
    clarion events endpoints disable ID
    clarion events endpoints rotate ID [--overlap 24h]
    clarion events endpoints remove ID
    clarion events replay --since 2026-12-01T08:00Z [--endpoint ID]   (or --since 6h: ago)

The same checks as /v1/webhook-endpoints (tasks/event_endpoints.py). A secret is printed once: on
add (unless given) and on rotate.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta

from clarion import clock
from clarion.errors import InvalidRequest
from clarion.links import parse_ttl
from clarion.tasks import event_endpoints


def parse_since(value: str) -> datetime:
    """An ISO time (UTC when it names no zone), or a span ago: 30m, 6h, 2d."""
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        try:
            return clock.now() - timedelta(seconds=parse_ttl(value))
        except InvalidRequest as exc:
            raise InvalidRequest(
                f"--since takes an ISO time (2026-12-01T08:00Z) or a span ago (6h, 2d): {value!r}"
            ) from exc
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _line(e: event_endpoints.Endpoint) -> str:
    state = "enabled" if e.enabled else f"DISABLED ({e.disabled_reason})"
    failing = f"; failing since {e.failing_since:%Y-%m-%d %H:%M} UTC" if e.failing_since else ""
    return f"{e.id}\t{e.url}\t{state}{failing}\t{' '.join(e.kinds)}"


def run(args: argparse.Namespace) -> int:
    if args.what == "replay":
        again = event_endpoints.replay(parse_since(args.since), args.endpoint or None)
        print(f"{again} events to send again (same webhook-id: receivers drop what they have)")
        return 0
    action = args.action
    if action == "add":
        made = event_endpoints.create(
            args.url, args.kind or ["*"], description=args.description, secret=args.secret
        )
        if args.secret is None:
            print(made.secret)
        print(f"endpoint {made.id}: {made.url} ({' '.join(made.kinds)})", file=sys.stderr)
    elif action == "list":
        for e in event_endpoints.listed():
            print(_line(e))
    elif action == "remove":
        event_endpoints.remove(args.id)
        print(f"endpoint {args.id} removed, with the events it had not taken")
    elif action == "rotate":
        overlap = parse_ttl(args.overlap) if args.overlap else None
        rotated = event_endpoints.change(args.id, rotate=True, overlap=overlap)
        print(rotated.secret)
        print(
            f"endpoint {args.id}: new secret; the previous one signs until "
            f"{rotated.previous_until:%Y-%m-%d %H:%M} UTC",
            file=sys.stderr,
        )
    else:
        changed = event_endpoints.change(args.id, enabled=action == "enable")
        print(_line(changed))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "events", help="apps' endpoints for outbound events; replay what they missed"
    )
    what = ev.add_subparsers(dest="what", required=True)
    ep = what.add_parser("endpoints", help="register, list, enable, rotate and remove endpoints")
    actions = ep.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="register an endpoint; prints its secret once")
    add.add_argument("url")
    add.add_argument(
        "--kind", action="append", help="an event kind it wants (repeatable; default: all, *)"
    )
    add.add_argument("--description", default="")
    add.add_argument("--secret", help="a whsec_ secret to use (default: one is made)")
    actions.add_parser("list", help="every endpoint: URL, state, kinds")
    for name, said in (
        ("enable", "enable (an endpoint disabled after a day of failures); its events go out"),
        ("disable", "stop sending to it; its events wait"),
        ("remove", "remove it and the events it had not taken"),
    ):
        actions.add_parser(name, help=said).add_argument("id", type=int)
    rot = actions.add_parser("rotate", help="a new secret; the old one signs for an overlap")
    rot.add_argument("id", type=int)
    rot.add_argument("--overlap", help="how long the old secret still signs: 30m, 24h (default 1d)")
    rp = what.add_parser("replay", help="send every event since a time again (same ids)")
    rp.add_argument("--since", required=True, help="2026-12-01T08:00Z, or a span ago: 6h, 2d")
    rp.add_argument("--endpoint", type=int, action="append", help="only these (repeatable)")
    ev.set_defaults(fn=run)
