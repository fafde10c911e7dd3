"""The support staff's activity page: `GET /activity`, read-only, never public.

Search by user id, request id, the app's event id or an address (db/activity.find_users: an
address is matched through its keyed hash too, so an erased recipient's suppression is found), and
read each request's whole story in time order — the request, the gates' decisions with their
reasons in words, each delivery per channel with its attempts and outcome, the provider receipts,
the incidents and the outbound events — with every time in the recipient's zone and in the
viewer's (the `tz` field; no script runs here, so the browser cannot tell us). The records are
those `clarion explain` prints (db/activity.py), the steps those `GET /v1/requests/{id}` answers as
`timeline` (web/activity_view.py).

Who may read it, checked before anything else: an API key holding `activity:read`, presented as
`Authorization: Bearer clk_…` (401 without a key or with an unknown one, 403 for a key of another
scope), or a staff link from `clarion staff-link --staff NAME` (`?s=TOKEN`): HMAC-signed like the
preferences links (clarion/links.py) but for another purpose, so a recipient's preferences link can
never open it, and short-lived (at most 24 h; 401 once expired, 403 when tampered with). A refusal
is a page in words that shows no data. Every view is logged with who looked and what they searched.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from clarion import clock, links, settings
from clarion import validation as check
from clarion.db import activity
from clarion.db.engine import engine
from clarion.errors import ClarionError, InvalidRequest
from clarion.web import activity_view as view
from clarion.web.api_auth import authorize
from clarion.web.api_errors import ApiError

log = logging.getLogger(__name__)

PATH = "/activity"
PURPOSE = "activity staff"  # not "preferences": a recipient's link never opens this page
SCOPE = "activity:read"
DEFAULT_TTL = "8h"
MAX_TTL = 24 * 3600.0
HISTORY_DAYS = 90
MAX_REQUESTS = 50
_TEMPLATES = Path(__file__).parent / "templates"
_env = Environment(loader=FileSystemLoader(_TEMPLATES), autoescape=True, undefined=StrictUndefined)
_CSS = (_TEMPLATES / "activity.css").read_text()
_CSS_HASH = base64.b64encode(hashlib.sha256(_CSS.encode()).digest()).decode()
HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # a staff link is a credential: never in a Referer
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "X-Robots-Tag": "noindex",
    "Content-Security-Policy": (
        f"default-src 'none'; style-src 'sha256-{_CSS_HASH}'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
}
TITLE = "Notification activity"
INTRO = (
    "Search by user id, request id, the app's event id or an address to see what happened to a "
    "recipient's notifications, step by step. Read-only."
)


# --- staff links -----------------------------------------------------------------------------


def _ttl(ttl: str | float | timedelta) -> float:
    seconds = links.parse_ttl(ttl)
    if seconds > MAX_TTL:
        raise InvalidRequest(f"ttl: a staff link lives at most 24h, not {seconds:g} s")
    return seconds


def staff_token(
    staff: str, *, ttl: str | float | timedelta = DEFAULT_TTL, now: datetime | None = None
) -> str:
    """A signed token that opens the activity page for `staff` (a name, for the log) until `ttl`
    from `now` (at most 24 h)."""
    who = check.text("staff", staff, max_bytes=200)
    expires = int((now or clock.now()).timestamp() + _ttl(ttl))
    return links.sign(links.link_key(settings.get()), PURPOSE, who, expires)


def staff_link(staff: str, *, ttl: str | float | timedelta = DEFAULT_TTL) -> str:
    """The activity page's URL under CLARION_PUBLIC_URL with a staff token (`clarion staff-link`)."""
    return f"{settings.get().public_url.rstrip('/')}{PATH}?s={staff_token(staff, ttl=ttl)}"


def read_staff_token(token: str, *, now: datetime | None = None) -> str:
    """The staff name a token names; BadLink or ExpiredLink (clarion.links) otherwise."""
    return links.verify(links.link_key(settings.get()), PURPOSE, token, now=now or clock.now())


# --- the page --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    their_time: str
    your_time: str
    step: view.Step


@dataclass(frozen=True)
class Story:
    """One request as the page shows it."""

    id: int
    title: str
    verdict: str
    rows: list[Row]


@dataclass(frozen=True)
class Person:
    user_id: str
    timezone: str
    erased: bool
    suppressions: list[tuple[str, str, Row]]  # (channel, address, when)
    stories: list[Story]


@dataclass(frozen=True)
class Search:
    user: str
    request: str
    event: str
    address: str
    tz: str

    @classmethod
    def of(cls, request: Request) -> Search:
        q = request.query_params
        user, number, event, address = (
            q.get(n, "").strip()[:512] for n in ("user", "request", "event", "address")
        )
        return cls(user, number, event, address, q.get("tz", "UTC").strip()[:64] or "UTC")

    @property
    def empty(self) -> bool:
        return not (self.user or self.request or self.event or self.address)


class Refusal(ClarionError):
    def __init__(
        self, status: int, title: str, text: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{status} {title}")
        self.status, self.title, self.text, self.headers = status, title, text, headers or {}


NO_ACCESS = "Use a staff link (clarion staff-link) or an API key with the activity:read scope."


def _viewer(request: Request) -> tuple[str, str]:
    """(who, the staff token to carry in the form) — or a Refusal before anything is read."""
    header = request.headers.get("authorization")
    token = request.query_params.get("s")
    if header or not token:
        try:
            key = authorize(header, SCOPE)
        except ApiError as exc:
            title = "Not allowed" if exc.status == 403 else "Sign-in needed"
            raise Refusal(
                exc.status, title, f"{exc.reason}. {NO_ACCESS}", headers=exc.headers
            ) from exc
        return f"key {key.prefix} ({key.name})", ""
    try:
        return f"staff link of {read_staff_token(token)}", token
    except links.ExpiredLink as exc:
        raise Refusal(401, "This staff link has expired", f"{exc}. Ask for a new one.") from exc
    except links.BadLink as exc:
        raise Refusal(403, "This staff link does not work", f"{exc}. {NO_ACCESS}") from exc


def _html(status: int, headers: dict[str, str] | None = None, **values: Any) -> HTMLResponse:
    defaults: dict[str, Any] = {
        "people": [],
        "search": None,
        "token": "",
        "message": None,
        "text": [],
    }
    page = _env.get_template("activity.html").render(
        {**defaults, **values, "css": Markup(_CSS), "intro": INTRO}
    )
    return HTMLResponse(page, status_code=status, headers={**HEADERS, **(headers or {})})


async def show(request: Request) -> Response:
    """GET /activity: the search form, and the stories of the recipients it found."""
    try:
        who, token = await run_in_threadpool(_viewer, request)
    except Refusal as refused:
        log.info(
            "activity page refused: %s",
            refused.text,
            extra={"action": "activity_refused", "status": refused.status},
        )
        return _html(refused.status, refused.headers, title=refused.title, text=[refused.text])
    search = Search.of(request)
    try:
        people = await run_in_threadpool(_people, search)
    except InvalidRequest as exc:
        return _html(400, title=TITLE, search=search, token=token, message=str(exc))
    log.info(
        "activity page viewed by %s",
        who,
        extra={
            "action": "activity_viewed",
            "viewer": who,
            "found": [p.user_id for p in people],
            "searched": [n for n in ("user", "request", "event", "address") if getattr(search, n)],
        },
    )
    message = None
    if not search.empty and not people:
        message = "No recipient matches that search."
    return _html(200, title=TITLE, search=search, token=token, people=people, message=message)


def _people(search: Search) -> list[Person]:
    viewer = view.zone(search.tz)
    if viewer is None:
        raise InvalidRequest(
            f"tz: {search.tz[:64]!r} is not an IANA time zone (e.g. Europe/Berlin)"
        )
    if search.empty:
        return []
    request_id = None
    if search.request:
        if not (
            search.request.isascii()
            and search.request.isdigit()
            and 0 < int(search.request) < 2**63
        ):
            raise InvalidRequest(
                f"request: a request id is a whole number, not {search.request[:40]!r}"
            )
        request_id = int(search.request)
    for name in ("user", "event", "address"):
        value = getattr(search, name)
        if value:
            check.text(name, value, max_bytes=512)
    now = clock.now()
    with engine().connect() as conn:
        matches = activity.find_users(
            conn,
            user_id=search.user or None,
            request_id=request_id,
            event_id=search.event or None,
            address=search.address or None,
        )
        return [_person(conn, m, viewer, now) for m in matches[: activity.MAX_MATCHES]]


def _person(conn: Any, match: activity.Match, viewer: ZoneInfo, now: datetime) -> Person:
    theirs = view.zone(match.timezone) or view.UTC

    def row(step: view.Step) -> Row:
        return Row(view.local(step.at, theirs), view.local(step.at, viewer), step)

    if match.request_ids:
        histories = activity.requests_by_id(conn, match.user_id, list(match.request_ids))
    else:
        since = now - timedelta(days=HISTORY_DAYS)
        histories = activity.requests_of(
            conn, match.user_id, type_key=None, since=since, limit=MAX_REQUESTS
        )
    stories = [
        Story(
            h.id,
            f"Request {h.id}: {h.type_key}" + (f" (event {h.event_id})" if h.event_id else ""),
            view.verdict(h, now),
            [row(s) for s in view.timeline(h, now)],
        )
        for h in histories
    ]
    listed = [
        (
            s.channel,
            s.address,
            row(
                view.Step(
                    s.created_at,
                    "suppression",
                    s.channel,
                    s.reason,
                    s.reason,
                    view.words(s.reason),
                    s.detail,
                )
            ),
        )
        for s in activity.suppressions(conn, match.user_id)
    ]
    return Person(match.user_id, match.timezone, match.erased, listed, stories)


def routes() -> list[Route]:
    """The activity page's route, mounted by web.app."""
    return [Route(PATH, show, methods=["GET"])]
