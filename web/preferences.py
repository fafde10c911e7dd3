"""The recipients' preferences page, reached through a signed, expiring link (tasks.links).

`GET /preferences?t=TOKEN` shows every type of the catalog by category × channel with the
recipient's current answer (tasks.preferences.get_preferences, as the API computes it); locked
types are shown fixed, with the reason. `POST /preferences?t=TOKEN` saves the cells the recipient
changed through tasks.preferences.set_preferences (the function the API writes with; there is no
other write path) and shows the page again with a confirmation.

Order of checks, each stopping at the first refusal, none writing anything: the token's signature
and expiry (403 / 410, before the body or anything else is read); on POST, a cross-site request
(Sec-Fetch-Site) 403; the body's type and size (415 / 413); the form's CSRF token, an HMAC bound
to the link (403); the form's cells against the catalog (400). Every answer is a whole HTML page
in words, never a traceback. Plain HTML with no script: the Content-Security-Policy allows none.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from clarion.errors import InvalidRequest, UnknownRecipient
from clarion.links import BadLink, ExpiredLink
from clarion.tasks import links, runtime
from clarion.tasks.preferences import get_preferences, set_preferences
from clarion.web import preferences_view as view
from clarion.web.inbound import Refused, read_body

log = logging.getLogger(__name__)

FORM_LIMIT = 256 * 1024
MAX_FIELDS = 10_000
_TEMPLATES = Path(__file__).parent / "templates"
_env = Environment(loader=FileSystemLoader(_TEMPLATES), autoescape=True, undefined=StrictUndefined)
_CSS = (_TEMPLATES / "preferences.css").read_text()
_CSS_HASH = base64.b64encode(hashlib.sha256(_CSS.encode()).digest()).decode()
HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # the link is a credential: never in a Referer
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        f"default-src 'none'; style-src 'sha256-{_CSS_HASH}'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
}
# (status, title, text) of each refusal the recipient may meet
BAD_LINK = (
    403,
    "This link does not work",
    "It may have been changed or cut short. Open the newest link we sent you, or ask for a new "
    "one. Nothing was changed.",
)
EXPIRED = (
    410,
    "This link has expired",
    "Links to your notification settings work for a limited time. Ask for a new one. Nothing "
    "was changed.",
)
UNKNOWN = (404, "No settings found", "We have no notification settings for this link.")
FORM_REFUSED = (
    403,
    "Your changes were not saved",
    "The form could not be checked. Open your link again and repeat the changes. Nothing was "
    "changed.",
)
STALE = (
    400,
    "Your changes were not saved",
    "The list of notifications changed since the page was opened. Open your link again and "
    "repeat the changes. Nothing was changed.",
)


def _html(status: int, **values: Any) -> HTMLResponse:
    defaults: dict[str, Any] = {
        "groups": [],
        "saved": None,
        "text": [],
        "token": "",
        "csrf": "",
    }
    page = _env.get_template("preferences.html").render(
        {
            **defaults,
            **values,
            "css": Markup(_CSS),
            "shown_state": view.shown_state,
            "save": view.SAVE,
        }
    )
    return HTMLResponse(page, status_code=status, headers=HEADERS)


def _refused(answer: tuple[int, str, str], reason: str, status: int | None = None) -> HTMLResponse:
    log.info(
        "preferences page refused: %s",
        reason,
        extra={"action": "preferences_page_refused", "status": status or answer[0]},
    )
    return _html(status or answer[0], title=answer[1], text=[answer[2]])


def _user(request: Request) -> tuple[str, str]:
    """(user id, token) of the request's link: BadLink / ExpiredLink before anything else."""
    token = request.query_params.get("t", "")
    return links.read_preferences_token(token), token


def _page(user: str, token: str, saved: str | None = None) -> HTMLResponse:
    groups = view.groups(runtime.catalog(), get_preferences(user))
    return _html(
        200,
        title=view.TITLE,
        text=[view.INTRO],
        groups=groups,
        saved=saved,
        token=token,
        csrf=links.form_token(token),
    )


async def show(request: Request) -> Response:
    """GET: the page for the link's recipient."""
    try:
        user, token = _user(request)
    except ExpiredLink as exc:
        return _refused(EXPIRED, str(exc))
    except BadLink as exc:
        return _refused(BAD_LINK, str(exc))
    try:
        return await run_in_threadpool(_page, user, token)
    except UnknownRecipient:
        return _refused(UNKNOWN, "unknown recipient")


async def save(request: Request) -> Response:
    """POST: save the cells the recipient changed, then show the page with a confirmation."""
    try:
        user, token = _user(request)
    except ExpiredLink as exc:
        return _refused(EXPIRED, str(exc))
    except BadLink as exc:
        return _refused(BAD_LINK, str(exc))
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return _refused(FORM_REFUSED, "cross-site form post")
    try:
        form = await _form(request)
    except Refused as error:
        return _refused(FORM_REFUSED, error.reason, status=error.status)
    if not links.check_form_token(token, _one(form, "csrf")):
        return _refused(FORM_REFUSED, "bad csrf token")
    try:
        changes = view.changes(runtime.catalog(), form)
        return await run_in_threadpool(_save, user, token, changes)
    except UnknownRecipient:
        return _refused(UNKNOWN, "unknown recipient")
    except (view.StaleForm, InvalidRequest) as exc:
        return _refused(STALE, str(exc))


def _save(user: str, token: str, changes: dict[str, bool]) -> HTMLResponse:
    if changes:
        set_preferences(user, changes)
    log.info(
        "preferences saved",
        extra={"action": "preferences_page_saved", "user_id": user, "changes": len(changes)},
    )
    n = len(changes)
    saved = view.SAVED.format(n=n, s="" if n == 1 else "s") if n else view.NOTHING_SAVED
    return _page(user, token, saved)


async def _form(request: Request) -> dict[str, list[str]]:
    media = (request.headers.get("content-type") or "").partition(";")[0].strip().lower()
    if media != "application/x-www-form-urlencoded":
        raise Refused(415, "not a form post")
    body = await read_body(request, FORM_LIMIT)
    try:
        return parse_qs(
            body.decode("utf-8"),
            keep_blank_values=True,
            max_num_fields=MAX_FIELDS,
            strict_parsing=False,
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(400, f"unreadable form ({type(exc).__name__})") from exc


def _one(form: dict[str, list[str]], name: str) -> str:
    values = form.get(name, [])
    return values[0] if len(values) == 1 else ""


def routes() -> list[Route]:
    """The preferences page's routes, mounted by web.app."""
    return [
        Route(links.PATH, show, methods=["GET"]),
        Route(links.PATH, save, methods=["POST"]),
    ]
