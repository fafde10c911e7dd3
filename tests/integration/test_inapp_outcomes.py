"""The in-app channel's three outcomes, produced for real on the wire to PostgreSQL: every
connection of this process goes through a small TCP proxy (a stand-in for a pooler such as
pgbouncer) that, once told, cuts the connection the inbox insert runs on at one exact moment:

- before the insert reaches the server: failed (TransientSendError), nothing stored, retried;
- COMMIT never reaches the server: unknown; the server rolls back; the resend under the key is a
  first arrival (one item, no incident);
- COMMIT reaches the server, which commits, and its answer is lost: unknown; the resend finds the
  item (one item) and says so: a `repeat` incident.

Counted in PostgreSQL's own rows of inbox_items, which only a committed transaction leaves.
(pg_terminate_backend from another connection could cut the first two cases too, but not the
third: a backend terminated after it committed is indistinguishable from one that did not, and
hitting the instant between commit and answer needs the wire.)
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url, text

from clarion.db.engine import engine
from clarion.tasks import register_recipient
from clarion.tasks.deliver import deliver
from tests.support.inbox import items, routed
from tests.support.pipeline import configure, publishing_to_this_tests_broker, rows

pytestmark = pytest.mark.integration
CATALOG = Path(__file__).parents[1] / "catalog_inapp.yaml"
STARTUP_REQUESTS = {80877103, 80877104}  # SSLRequest, GSSENCRequest: answered with one byte


class CuttingProxy:
    """Forwards PostgreSQL connections; `cut = mode` cuts the next inbox store once:
    "before_insert" | "before_commit" | "after_commit"."""

    def __init__(self, upstream: tuple[int, str | tuple[str, int]]) -> None:
        self.family, self.address = upstream
        self.cut: str | None = None
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(self.family, socket.SOCK_STREAM)
            server.connect(self.address)
            Connection(self, client, server)

    def take(self, mode: str) -> bool:
        with self.lock:
            if self.cut != mode:
                return False
            self.cut, self.cuts = None, self.cuts + 1
            return True

    def close(self) -> None:
        self.listener.close()


class Connection:
    def __init__(self, proxy: CuttingProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.inbox_statements: set[bytes] = set()
        self.armed = False  # this connection has run the inbox insert in its open transaction
        self.drop_answer = False
        threading.Thread(target=self._upstream, daemon=True).start()
        threading.Thread(target=self._downstream, daemon=True).start()

    def _close(self) -> None:
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.client.recv(n - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def _upstream(self) -> None:
        try:
            while True:  # untyped startup messages first
                head = self._read(4)
                body = self._read(struct.unpack("!I", head)[0] - 4)
                self.server.sendall(head + body)
                if struct.unpack("!I", body[:4])[0] not in STARTUP_REQUESTS:
                    break
            while True:
                kind = self._read(1)
                head = self._read(4)
                body = self._read(struct.unpack("!I", head)[0] - 4)
                if not self._judge(kind, body):
                    self._close()
                    return
                self.server.sendall(kind + head + body)
        except OSError:
            self._close()

    def _judge(self, kind: bytes, body: bytes) -> bool:
        """Forward this message? (False: cut the connection here.)"""
        inserts = b"INSERT INTO inbox_items" in body
        if kind == b"P" and inserts:
            self.inbox_statements.add(body.split(b"\0", 1)[0])
        runs_insert = (kind == b"Q" and inserts) or (
            kind == b"B" and body.split(b"\0")[1] in self.inbox_statements
        )
        if runs_insert:
            if self.proxy.take("before_insert"):
                return False
            self.armed = True
        if kind == b"Q" and body.startswith(b"COMMIT") and self.armed:
            self.armed = False
            if self.proxy.take("before_commit"):
                return False
            if self.proxy.take("after_commit"):
                self.drop_answer = True
        return True

    def _downstream(self) -> None:
        try:
            while True:
                data = self.server.recv(65536)
                if not data or self.drop_answer:  # the server has committed and answered
                    break
                self.client.sendall(data)
        except OSError:
            pass
        self._close()


def _upstream_of(url: str) -> tuple[int, str | tuple[str, int]]:
    parsed = make_url(url)
    socket_dir = parsed.query.get("host")
    if socket_dir:
        return socket.AF_UNIX, f"{socket_dir}/.s.PGSQL.{parsed.port or 5432}"
    return socket.AF_INET, (parsed.host or "127.0.0.1", parsed.port or 5432)


@pytest.fixture
def proxy(clarion_env, monkeypatch) -> Iterator[CuttingProxy]:
    cutter = CuttingProxy(_upstream_of(clarion_env.database_url))
    real = make_url(clarion_env.database_url)
    through = real.set(host="127.0.0.1", port=cutter.port, query={"sslmode": "disable"})
    configure(
        monkeypatch, catalog=CATALOG, database_url=through.render_as_string(hide_password=False)
    )
    register_recipient("ana", timezone="UTC")
    with publishing_to_this_tests_broker():
        yield cutter
    cutter.close()


def _attempt(key: tuple[str, int]) -> int:
    with engine().begin() as conn:  # the backoff is not what is tested here
        conn.execute(text("UPDATE deliveries SET not_before = now() WHERE state = 'pending'"))
    return deliver([key[0]], [key[1]])


def _row(key: tuple[str, int]) -> dict:
    [row] = rows(
        "SELECT state, maybe_sent_at IS NOT NULL AS maybe_sent, last_error FROM deliveries "
        "WHERE id = :d",
        d=key[1],
    )
    return row


def _incidents() -> list[str]:
    return [r["kind"] for r in rows("SELECT kind FROM incidents ORDER BY id")]


def test_cut_before_the_insert_is_a_failure_that_is_retried(proxy):
    proxy.cut = "before_insert"  # the route's own send of what it routed is cut
    [key] = routed("ana", "inbox_note", "e1", n="1")
    assert proxy.cuts == 1
    row = _row(key)
    assert row["state"] == "pending" and not row["maybe_sent"]
    assert row["last_error"].startswith("store_failed")
    assert items() == []
    assert _attempt(key) == 1
    assert len(items()) == 1 and _row(key)["state"] == "sent" and _incidents() == []


@pytest.mark.parametrize("type_key", ["inbox_note", "inbox_alert"])
def test_commit_that_never_arrived_is_unknown_and_the_resend_is_the_first_arrival(proxy, type_key):
    proxy.cut = "before_commit"  # the route's own send of what it routed is cut
    [key] = routed("ana", type_key, "e1", n="1", host="h", cluster="c")
    assert proxy.cuts == 1
    row = _row(key)
    assert row["state"] == "pending" and row["maybe_sent"]  # may have sent: resent under the key
    assert row["last_error"].startswith("commit_lost")
    assert items() == []  # the server rolled it back
    assert _attempt(key) == 1
    assert len(items()) == 1 and _row(key)["state"] == "sent" and _incidents() == []


@pytest.mark.parametrize("type_key", ["inbox_note", "inbox_alert"])
def test_commit_whose_answer_was_lost_is_unknown_and_the_resend_finds_the_item(proxy, type_key):
    proxy.cut = "after_commit"  # the route's own send of what it routed is cut
    [key] = routed("ana", type_key, "e1", n="1", host="h", cluster="c")
    assert proxy.cuts == 1
    row = _row(key)
    assert row["state"] == "pending" and row["maybe_sent"]
    [item] = items()  # committed, though the worker never heard so
    assert _attempt(key) == 1
    assert items() == [item] and _row(key)["state"] == "sent"
    assert rows("SELECT provider_message_id FROM deliveries") == [
        {"provider_message_id": str(item["id"])}
    ]
    assert _incidents() == ["repeat"]  # the store said it had this delivery already
