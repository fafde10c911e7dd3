"""`clarion web` (the HTTP process, for production) and `clarion ping` (a worker's readiness)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from clarion import settings
from clarion.names import QUEUES


def _bind(value: str) -> tuple[str, int] | str:
    from clarion.web.server import parse_bind

    if value == "same":
        return value
    try:
        return parse_bind(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def admin_bind(
    host: str, port: int, chosen: tuple[str, int] | str | None
) -> tuple[str, int] | None:
    """Where the admin routes go: None (the public listener) when asked ("same") or when the
    public host is loopback anyway; else the chosen bind, by default 127.0.0.1:<port + 1>."""
    from clarion.web.app import is_loopback

    if chosen == "same":
        return None
    if isinstance(chosen, tuple):
        return chosen
    return None if is_loopback(host) else ("127.0.0.1", port + 1 if port else 0)


def _web(args: argparse.Namespace) -> int:
    from clarion.web.app import check_bind, is_loopback
    from clarion.web.server import WebOptions, serve

    warning = check_bind(
        args.host, settings.get().teams_app_id, allow_insecure_teams=args.allow_insecure_teams
    )
    if warning:
        print(warning, file=sys.stderr, flush=True)
    settings.get().urls()
    admin = admin_bind(args.host, args.port, args.admin_bind)
    if admin is None and not is_loopback(args.host):
        print(
            f"clarion: WARNING: /metrics, /docs and /openapi.json are served on {args.host} "
            "(--admin-bind same)",
            file=sys.stderr,
            flush=True,
        )
    options = WebOptions(
        host=args.host,
        port=args.port,
        workers=args.workers,
        admin=admin,
        proxy_headers=args.proxy_headers,
        forwarded_allow_ips=args.forwarded_allow_ips,
        root_path=args.root_path,
        header_timeout=args.header_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        access_log=args.access_log,
    )
    return serve(options)


def _positive(kind: type) -> Any:
    def parse(value: str) -> Any:
        try:
            parsed = kind(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected a number, not {value[:40]!r}") from exc
        if not parsed > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, not {value[:40]!r}")
        return parsed

    return parse


def add_web(sub: Any) -> None:
    wb = sub.add_parser(
        "web",
        help="serve the HTTP API, Slack and Teams endpoints, provider webhooks, the preferences "
        "page, /healthz, /readyz and /metrics (ASGI, uvicorn)",
    )
    wb.add_argument("--host", default="127.0.0.1")
    wb.add_argument("--port", type=int, default=8000)
    wb.add_argument("--workers", type=_positive(int), default=1, help="processes (default 1)")
    wb.add_argument(
        "--admin-bind",
        type=_bind,
        default=None,
        metavar="HOST:PORT|same",
        help="serve /metrics, /docs and /openapi.json only here (the public listener answers 404 "
        "for them); default: the public listener when --host is loopback, else "
        "127.0.0.1:<port+1>; `same` keeps them on the public listener",
    )
    wb.add_argument(
        "--proxy-headers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="trust X-Forwarded-For/-Proto from --forwarded-allow-ips (default: on)",
    )
    wb.add_argument(
        "--forwarded-allow-ips",
        default="127.0.0.1",
        help="comma-separated proxy addresses or networks whose X-Forwarded-* are trusted, or * "
        "(default 127.0.0.1)",
    )
    wb.add_argument(
        "--root-path",
        default="",
        help="the prefix a proxy strips before forwarding (e.g. /notify); set CLARION_PUBLIC_URL "
        "to match",
    )
    wb.add_argument(
        "--header-timeout",
        type=_positive(float),
        default=10.0,
        help="seconds a request's headers may take to arrive; then 408 and close (default 10)",
    )
    wb.add_argument(
        "--keep-alive-timeout",
        type=_positive(float),
        default=5.0,
        help="seconds an idle kept-alive connection stays open (default 5)",
    )
    wb.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="log a line per request at INFO (uvicorn's access log; default: off, errors are "
        "logged either way)",
    )
    wb.add_argument(
        "--allow-insecure-teams",
        action="store_true",
        help="with CLARION_TEAMS_APP_ID=none, serve on a non-loopback host anyway (unauthenticated!)",
    )
    wb.set_defaults(fn=_web)


def _ping(args: argparse.Namespace) -> int:
    from clarion.ops.ping import ping

    ok, line = ping(args.lane or list(QUEUES), timeout=args.timeout)
    print(line if ok else f"clarion: {line}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def add_ping(sub: Any) -> None:
    pg = sub.add_parser(
        "ping",
        help="exit 0 when a worker answers for every lane asked (default: all), 1 with the reason",
    )
    pg.add_argument("--lane", action="append", choices=QUEUES, help="repeatable")
    pg.add_argument(
        "--timeout", type=_positive(float), default=3.0, help="seconds to wait (default 3)"
    )
    pg.set_defaults(fn=_ping)
