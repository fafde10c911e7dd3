"""`clarion web` for production: uvicorn with worker processes, proxy headers, keep-alive and
request-header timeouts, and the admin routes (/metrics, /docs, /openapi.json) on a second
listener.

uvicorn has no request-header timeout: a client that sends its headers one byte at a time holds
a connection (and a file descriptor) for as long as it likes. `HeaderTimeoutProtocol` is uvicorn's
h11 protocol with a deadline: a request's headers must be complete within `header_timeout`
seconds of its first byte (of the connection, for the first request); otherwise the server answers
408 and closes. The body and the response are not limited by it.

    serve(WebOptions(host="0.0.0.0", port=8000, workers=4, admin=("127.0.0.1", 8001)))
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.supervisors import Multiprocess

from clarion import logs, settings

log = logging.getLogger("clarion.web")


def _frozen(app: Any) -> Any:
    """`app`, with everything built so far moved out of the garbage collector's view
    (gc.freeze): a process serving requests otherwise walks its whole startup heap (FastAPI,
    pydantic, SQLAlchemy, the catalog: ~200k objects) on every full collection — measured at
    ~300 ms each on a loaded 2-core host, one every batch or two of 500 events, with the event
    loop stopped meanwhile. Startup objects live as long as the process anyway."""
    gc.collect()
    gc.freeze()
    return app


def served_app() -> Any:
    """`clarion web`'s app (web.app.create_app), its startup heap frozen."""
    from clarion.web.app import create_app

    return _frozen(create_app())


def served_public_app() -> Any:
    """`clarion web --admin-bind`'s public app (web.app.public_app), its startup heap frozen."""
    from clarion.web.app import public_app

    return _frozen(public_app())


TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class WebConfig(uvicorn.Config):
    """uvicorn's Config and the header timeout (pickled whole into each spawned worker)."""

    def __init__(self, *args: Any, header_timeout: float = 10.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are not complete within
    `config.header_timeout` seconds of the request's first byte (or of the connection)."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.header_timeout = float(getattr(config, "header_timeout", 10.0))
        self.header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.header_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # headers complete (h11 has parsed the request line and headers)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        pipelined = bool(self.conn.trailing_data[0])
        if pipelined and self.conn.their_state is h11.IDLE and self.header_deadline is None:
            self._arm()  # part of a pipelined request is already buffered

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self.header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def _headers_too_slow(self) -> None:
        self.header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info(
                "request headers not complete within %g s: closed",
                self.header_timeout,
                extra={"action": "web_header_timeout", "client": str(self.client)},
            )
            self.transport.write(TIMEOUT_408)
            self.transport.close()


@dataclass(frozen=True)
class WebOptions:
    """What `clarion web`'s flags choose. admin: None serves the admin routes on the public
    listener; (host, port) serves them there alone (the public listener answers 404 for them).
    access_log: uvicorn's line per request, off by default (about 3% of an ingest request's CPU,
    and a line per request at INFO is what a proxy or load balancer in front already writes);
    errors, refusals logged by clarion and uvicorn's own warnings are logged either way."""

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    admin: tuple[str, int] | None = None
    proxy_headers: bool = True
    forwarded_allow_ips: str = "127.0.0.1"
    root_path: str = ""
    header_timeout: float = 10.0
    keep_alive_timeout: float = 5.0
    log_level: str = "info"
    access_log: bool = False


def parse_bind(value: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[v6]:PORT`) -> (host, port); ValueError naming what is wrong."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:8001), not {value[:80]!r}")
    return host, int(port)


HEALTHCHECK_SECONDS = 60


def public_config(options: WebOptions) -> WebConfig:
    app = (
        "clarion.web.server:served_public_app" if options.admin else "clarion.web.server:served_app"
    )
    return WebConfig(
        app,
        factory=True,
        host=options.host,
        port=options.port,
        workers=options.workers,
        # uvicorn kills a spawned worker that does not answer its supervisor's ping within this
        # many seconds (default 5) and starts another; a worker still importing on a busy host
        # would be killed and re-spawned for ever. A hung worker is still replaced, later.
        timeout_worker_healthcheck=HEALTHCHECK_SECONDS,
        http=HeaderTimeoutProtocol,
        header_timeout=options.header_timeout,
        timeout_keep_alive=max(1, round(options.keep_alive_timeout)),
        proxy_headers=options.proxy_headers,
        forwarded_allow_ips=options.forwarded_allow_ips,
        root_path=options.root_path,
        log_level=options.log_level,
        access_log=options.access_log,
        log_config=logs.uvicorn_config(settings.get().log_format),
    )


def _admin_server(options: WebOptions) -> tuple[uvicorn.Server, socket.socket]:
    """The admin listener's server and its bound socket (bound here: errors surface at start)."""
    assert options.admin is not None
    host, port = options.admin
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    config = WebConfig(
        "clarion.web.app:admin_app",
        factory=True,
        http=HeaderTimeoutProtocol,
        header_timeout=options.header_timeout,
        timeout_keep_alive=max(1, round(options.keep_alive_timeout)),
        lifespan="off",
        root_path=options.root_path,
        log_level=options.log_level,
        access_log=options.access_log,
        log_config=logs.uvicorn_config(settings.get().log_format),
    )
    return uvicorn.Server(config), sock


def serve(options: WebOptions) -> int:
    """Serve until SIGINT/SIGTERM: the public listener (workers > 1: that many spawned
    processes sharing its socket) and, with an admin bind, the admin listener in this process."""
    admin: tuple[uvicorn.Server, threading.Thread] | None = None
    if options.admin:
        server, sock = _admin_server(options)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        bound = sock.getsockname()
        print(
            f"clarion: admin listener (/metrics, /docs, /openapi.json) on "
            f"http://{options.admin[0]}:{bound[1]}",
            file=sys.stderr,
            flush=True,
        )
        admin = (server, thread)
    config = public_config(options)
    public = uvicorn.Server(config)
    try:
        if options.workers > 1:
            Multiprocess(config, sockets=[config.bind_socket()]).run()
        else:
            public.run()
    except KeyboardInterrupt:
        pass
    finally:
        if admin:
            admin[0].should_exit = True
            admin[1].join(timeout=10)
    return 0 if options.workers > 1 or public.started else 1
