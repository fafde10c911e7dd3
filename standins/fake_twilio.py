"""A local Twilio: the Messages API wire format the real `twilio` SDK speaks, and Twilio's side of
clarion's webhooks (signed status callbacks and inbound messages). For tests and the demo.

Point the SDK at it with `CLARION_TWILIO_API_URL=server.url` (adapters.sms.RoutedHttpClient). It
answers `POST /2010-04-01/Accounts/{sid}/Messages.json` (a form body, HTTP basic auth with the
account SID and auth token) as Twilio does: 201 with the message resource (`sid` SM…, `status`
queued), or an error body `{"code", "message", "more_info", "status"}` (401 code 20003, 400
21211 / 21602 / 21604 / 21603, 429 20429 with Retry-After). Every accepted message is kept with
its arrival time (`time.monotonic()`), so a test can count segments per second.

Faults on demand:
- `losses.next("drop" | "late" | "5xx")`: the message is accepted, then its answer is lost;
- `storm(n, retry_after)`: the next `n` requests are answered 429 with Retry-After;
- `fail(500, times=n)`: the next `n` creates are answered a 5xx and nothing is taken (an outage);
  `refuse()` / `reopen()` (standins.local_server): connections refused, then served again;
- `fail_number(number, code)`: 21211 (invalid number) and 21610 (the recipient sent STOP) are
  refused at create; 30003 / 30005 / 30006 are accepted and come back `undelivered` later.

`GET …/Messages.json` lists messages as Twilio does: filtered by `To`, `From` and
`DateSent>` (Twilio's DateSent>=, by day: a time part is ignored), newest sent first, paged
(`PageSize`, `Page`, `next_page_uri`). Like Twilio, a message still queued has no `date_sent` and
is not listed under a DateSent filter: it gets one when the fake "sends" it — a status callback
past `queued` (`post_status`, `progress`), or `dispatch(sid)` when no callback is to come.

Callbacks are posted only when asked (deterministic): `progress(sid)` posts queued → sent →
delivered (or undelivered with the number's ErrorCode), `post_status(sid, status)` one of them,
`inbound(url, sender, body)` a reply to clarion's inbound webhook. Each is signed as Twilio signs
(`X-Twilio-Signature`: the SDK's RequestValidator over the full URL and the form parameters).
"""

from __future__ import annotations

import base64
import itertools
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlencode

from twilio.request_validator import RequestValidator

from clarion.adapters.sms import segments
from clarion.standins.local_server import AnswerLoss, LocalServer, send_json

API_VERSION = "2010-04-01"
REFUSED_CODES = {
    21211: "Invalid 'To' Phone Number",
    21610: "Attempt to send to unsubscribed recipient",
    21614: "'To' number is not a valid mobile number",
}
UNDELIVERED_CODES = {
    30003: "Unreachable destination handset",
    30005: "Unknown destination handset",
    30006: "Landline or unreachable carrier",
}


@dataclass
class Accepted:
    """One message the fake took."""

    sid: str
    to: str
    sender: str
    body: str
    segments: int
    status_callback: str | None
    arrived: float  # time.monotonic() when the request was read
    statuses: list[str] = field(default_factory=list)  # callbacks posted for it, in order
    created: float = 0.0  # wall-clock time (the fake's `now`) Twilio took it: date_created
    date_sent: float | None = None  # when Twilio sent it to the carrier; None while queued


@dataclass(frozen=True)
class Attempt:
    """Every Messages.json request, whatever its answer."""

    arrived: float
    status: int
    to: str


def sign(token: str, url: str, params: Mapping[str, str]) -> str:
    """X-Twilio-Signature for a request to `url` with these form parameters."""
    return str(RequestValidator(token).compute_signature(url, dict(params)))


def post_signed(token: str, url: str, params: Mapping[str, str]) -> tuple[int, bytes]:
    """POST a form to clarion as Twilio does; (status, body) of the answer."""
    request = urllib.request.Request(
        url,
        data=urlencode(params).encode(),
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": sign(token, url, params),
            "User-Agent": "TwilioProxy/1.1",
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class FakeTwilio(LocalServer):
    ACCOUNT_SID = "AC" + "c1a710" + "0" * 26
    AUTH_TOKEN = "clarion-twilio-test-token"
    NUMBER = "+15005550006"

    def __init__(
        self,
        now: Callable[[], float] = time.time,
        *,
        account_sid: str | None = None,
        auth_token: str | None = None,
    ) -> None:
        if account_sid is not None:  # a second account (tests of failover between accounts)
            self.ACCOUNT_SID = account_sid
        if auth_token is not None:
            self.AUTH_TOKEN = auth_token
        self.now = now  # the wall clock of date_created / date_sent
        self._outage: list[int] = []  # status of each create still to refuse (nothing taken)
        self.lookups: list[dict[str, str]] = []  # every list request's query
        self.accepted: list[Accepted] = []
        self.attempts: list[Attempt] = []
        self.failing: dict[str, int] = {}
        self.losses = AnswerLoss()
        self._storm: list[float] = []  # Retry-After of each 429 still to answer
        self._sids = itertools.count(1)
        self.lock = threading.Lock()
        super().__init__(self._handler())

    @property
    def url(self) -> str:
        return self.base_url

    # --- control and inspection ----------------------------------------------------------------

    def storm(self, n: int, retry_after: float = 1.0) -> None:
        """Answer the next `n` create requests 429 Too Many Requests with this Retry-After."""
        with self.lock:
            self._storm.extend([retry_after] * n)

    def fail(self, status: int, *, times: int = 1) -> None:
        """Answer the next `times` create requests `status` (a 5xx: Twilio's error body, code
        20500) without taking the message: an outage, not a lost answer (for that: `losses`)."""
        with self.lock:
            self._outage.extend([status] * times)

    def recover(self) -> None:
        """End an outage begun with `fail`: creates are taken again."""
        with self.lock:
            self._outage.clear()

    def fail_number(self, number: str, code: int) -> None:
        if code not in REFUSED_CODES and code not in UNDELIVERED_CODES:
            raise ValueError(f"no scripted failure for code {code}")
        with self.lock:
            self.failing[number] = code

    def messages(self, to: str | None = None) -> list[Accepted]:
        with self.lock:
            return [m for m in self.accepted if to is None or m.to == to]

    def message(self, sid: str) -> Accepted:
        with self.lock:
            return next(m for m in self.accepted if m.sid == sid)

    def throttled(self) -> list[Attempt]:
        with self.lock:
            return [a for a in self.attempts if a.status == 429]

    def segments_per_second(self) -> int:
        """The most segments accepted within any one second (a window sliding over arrivals)."""
        return sum(m.segments for m in self.busiest_second())

    def busiest_second(self) -> list[Accepted]:
        """The accepted messages of the one-second window holding the most segments."""
        with self.lock:
            arrivals = sorted(self.accepted, key=lambda m: m.arrived)
        best: tuple[int, int, int] = (0, 0, 0)  # segments, first, last index
        start, inside = 0, 0
        for end, message in enumerate(arrivals):
            inside += message.segments
            while arrivals[start].arrived <= message.arrived - 1.0:
                inside -= arrivals[start].segments
                start += 1
            best = max(best, (inside, start, end))
        return arrivals[best[1] : best[2] + 1] if best[0] else []

    # --- Twilio's side of clarion's webhooks -------------------------------------------------------

    def post_status(self, sid: str, status: str, *, error_code: int | None = None) -> int:
        """Post one signed status callback for a message; clarion's HTTP status."""
        message = self.message(sid)
        if not message.status_callback:
            raise ValueError(f"{sid} has no status callback")
        params = {
            "AccountSid": self.ACCOUNT_SID,
            "ApiVersion": API_VERSION,
            "From": message.sender,
            "MessageSid": sid,
            "MessageStatus": status,
            "SmsSid": sid,
            "SmsStatus": status,
            "To": message.to,
        }
        if error_code is not None:
            params["ErrorCode"] = str(error_code)
        with self.lock:
            message.statuses.append(status)
            if status not in ("queued", "accepted") and message.date_sent is None:
                message.date_sent = self.now()
        return post_signed(self.AUTH_TOKEN, message.status_callback, params)[0]

    def dispatch(self, sid: str) -> None:
        """Twilio sends a queued message to the carrier (it gets its date_sent), no callback."""
        with self.lock:
            message = next(m for m in self.accepted if m.sid == sid)
            if message.date_sent is None:
                message.date_sent = self.now()

    def progress(self, sid: str) -> list[tuple[str, int]]:
        """The callbacks of a message's life: queued, sent, then delivered, or undelivered with
        its number's error code. (status, clarion's HTTP status) each."""
        code = self.failing.get(self.message(sid).to)
        final = ("undelivered", code) if code in UNDELIVERED_CODES else ("delivered", None)
        steps = [("queued", None), ("sent", None), final]
        return [(s, self.post_status(sid, s, error_code=c)) for s, c in steps]

    def inbound(
        self, url: str, sender: str, body: str, *, to: str | None = None
    ) -> tuple[int, str]:
        """A signed inbound message (a reply) to clarion's webhook; (status, TwiML answer)."""
        params = {
            "AccountSid": self.ACCOUNT_SID,
            "ApiVersion": API_VERSION,
            "Body": body,
            "From": sender,
            "MessageSid": f"SM{next(self._sids):032x}",
            "NumMedia": "0",
            "NumSegments": "1",
            "To": to or self.NUMBER,
        }
        status, answer = post_signed(self.AUTH_TOKEN, url, params)
        return status, answer.decode()

    # --- the Messages API --------------------------------------------------------------------------

    def create(self, account: str, auth: str, form: dict[str, str]) -> tuple[int, dict, dict]:
        """(status, headers, body) for one Messages.json request; records it."""
        arrived = time.monotonic()
        with self.lock:
            status, headers, body = self._create(account, auth, form, arrived)
            self.attempts.append(Attempt(arrived, status, form.get("To", "")))
        return status, headers, body

    def _create(
        self, account: str, auth: str, form: dict[str, str], arrived: float
    ) -> tuple[int, dict, dict]:
        if auth != self._basic() or account != self.ACCOUNT_SID:
            return _error(401, 20003, "Authenticate")
        if self._outage:
            return _error(self._outage.pop(0), 20500, "Internal Server Error")
        if self._storm:
            wait = self._storm.pop(0)
            return _error(429, 20429, "Too Many Requests", {"Retry-After": f"{wait:g}"})
        to, body = form.get("To", ""), form.get("Body", "")
        sender = form.get("From") or form.get("MessagingServiceSid") or ""
        if not to:
            return _error(400, 21604, "A 'To' phone number is required.")
        if not sender:
            return _error(400, 21603, "A 'From' phone number is required.")
        if not body:
            return _error(400, 21602, "Message body is required.")
        code = self.failing.get(to)
        if not (to.startswith("+") and to[1:].isdigit()):
            code = 21211
        if code in REFUSED_CODES:
            return _error(400, code, f"{REFUSED_CODES[code]}: {to}")
        message = Accepted(
            f"SM{next(self._sids):032x}",
            to,
            sender,
            body,
            segments(body)[1],
            form.get("StatusCallback"),
            arrived,
            created=self.now(),
        )
        self.accepted.append(message)
        return 201, {}, self._resource(message)

    def listing(self, account: str, auth: str, query: dict[str, str]) -> tuple[int, dict]:
        """(status, body) for one Messages.json list request; records its query."""
        if auth != self._basic() or account != self.ACCOUNT_SID:
            return _error(401, 20003, "Authenticate")[::2]
        with self.lock:
            self.lookups.append(dict(query))
            found = [m for m in self.accepted if _listed(m, query)]
        found.sort(key=lambda m: (m.date_sent or 0.0, m.created), reverse=True)
        size = min(1000, max(1, int(query.get("PageSize", "50") or 50)))
        page = max(0, int(query.get("Page", "0") or 0))
        shown = found[page * size : (page + 1) * size]
        uri = f"/{API_VERSION}/Accounts/{account}/Messages.json"
        more = (page + 1) * size < len(found)
        rest = urlencode({k: v for k, v in query.items() if k not in ("Page", "PageToken")})
        return 200, {
            "messages": [self._resource(m) for m in shown],
            "start": page * size,
            "end": page * size + max(0, len(shown) - 1),
            "page": page,
            "page_size": size,
            "uri": f"{uri}?{urlencode(query)}",
            "first_page_uri": f"{uri}?{rest}&Page=0",
            "previous_page_uri": f"{uri}?{rest}&Page={page - 1}" if page else None,
            "next_page_uri": f"{uri}?{rest}&Page={page + 1}&PageToken=PA{page + 1}"
            if more
            else None,
        }

    def _basic(self) -> str:
        pair = f"{self.ACCOUNT_SID}:{self.AUTH_TOKEN}".encode()
        return "Basic " + base64.b64encode(pair).decode()

    def _resource(self, message: Accepted) -> dict[str, Any]:
        service = message.sender if message.sender.startswith("MG") else None
        sent = message.date_sent
        status = ("accepted" if service else "queued") if sent is None else "sent"
        return {
            "account_sid": self.ACCOUNT_SID,
            "api_version": API_VERSION,
            "body": message.body,
            "date_created": formatdate(message.created, usegmt=True),
            "date_sent": formatdate(sent, usegmt=True) if sent is not None else None,
            "date_updated": formatdate(sent or message.created, usegmt=True),
            "direction": "outbound-api",
            "error_code": None,
            "error_message": None,
            "from": None if service else message.sender,
            "messaging_service_sid": service,
            "num_media": "0",
            "num_segments": str(message.segments),
            "price": None,
            "price_unit": "USD",
            "sid": message.sid,
            "status": status,
            "subresource_uris": {},
            "to": message.to,
            "uri": f"/{API_VERSION}/Accounts/{self.ACCOUNT_SID}/Messages/{message.sid}.json",
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self
        prefix = f"/{API_VERSION}/Accounts/"

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.partition("?")[0]
                account, _, rest = path.removeprefix(prefix).partition("/")
                if not path.startswith(prefix) or rest != "Messages.json":
                    send_json(self, 404, {"code": 20404, "message": "Not Found", "status": 404})
                    return
                form = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
                status, headers, body = fake.create(
                    account, self.headers.get("Authorization", ""), form
                )
                if status == 201 and fake.losses.apply(self):
                    return
                send_json(self, status, body, headers)

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                path, _, raw = self.path.partition("?")
                account, _, rest = path.removeprefix(prefix).partition("/")
                if not path.startswith(prefix) or rest != "Messages.json":
                    send_json(self, 404, {"code": 20404, "message": "Not Found", "status": 404})
                    return
                query = dict(parse_qsl(raw, keep_blank_values=True))
                status, body = fake.listing(account, self.headers.get("Authorization", ""), query)
                send_json(self, status, body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _listed(message: Accepted, query: dict[str, str]) -> bool:
    """Whether a message passes a list request's To / From / DateSent>= filters (by day)."""
    if query.get("To") and message.to != query["To"]:
        return False
    if query.get("From") and message.sender != query["From"]:
        return False
    after = query.get("DateSent>") or query.get("DateSent>=")
    if after:
        if message.date_sent is None:  # still queued: Twilio has no sent date to filter by
            return False
        day = datetime.fromtimestamp(message.date_sent, UTC).date().isoformat()
        return day >= after[:10]
    return True


def _error(
    status: int, code: int, message: str, headers: dict[str, str] | None = None
) -> tuple[int, dict, dict]:
    body = {
        "code": code,
        "message": message,
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
        "status": status,
    }
    return status, headers or {}, body
