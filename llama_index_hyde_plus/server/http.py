"""Serve an `RcpServer` over HTTP with uvicorn (h11) and Starlette.

HTTP/1.1 parsing, keep-alive, chunked bodies and duplicate or conflicting
``Content-Length`` are h11's (a malformed request gets HTTP 400 with a JSON-RPC
-32600 body); the limits that make a public server safe are ours:

* **authentication**: with a token, a request without ``Authorization: Bearer
  <token>`` gets HTTP 401 / -32012 and the connection is closed, so its body is never
  read, let alone served as a request;
* **body size**: over 1 MiB (announced or streamed, chunked or not) gets HTTP 413 /
  -32013 and the connection is closed;
* **timeouts**: a connection that has not sent a whole request head within
  ``header_timeout`` seconds is answered 408 and closed (slowloris), a body not
  received within ``body_timeout`` seconds gets 408 / -32014; idle keep-alive
  connections close after ``keep_alive`` seconds;
* **caps**: at most ``max_connections`` open connections (more are answered 503 and
  closed, with one summarised warning a minute, not one per refusal), at most
  ``slow_bodies_per_client`` requests per client address whose body is still arriving
  (more get 503 and are closed: slow-body floods), and at most ``max_inflight``
  requests in flight (more get HTTP 503 / -32010 with ``Retry-After``), plus the
  batch, depth and size limits of `RcpServer`. A request takes an in-flight slot only
  once its whole body is in, so bodies that trickle in never lock out other clients.

Requests are served concurrently: the event loop only parses and routes, and the RCP
dispatch (LLM calls, searches) runs in a pool of worker threads. The path is ignored
(the official client posts to ``/rcp/<method>``); any method but POST gets 405. The
``RCP-Session`` header, when sent, names the request's session (`rcp.HttpRcpServer`).
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import h11
import rcp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from .._checks import is_int
from .rcp import MAX_BODY_BYTES, PROPAGATE, SESSION_HEADER, RcpServer, dumps, not_utf8

logger = logging.getLogger(__name__)

DEFAULT_MAX_INFLIGHT = 64
DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_KEEP_ALIVE = 5
DEFAULT_SLOW_BODIES_PER_CLIENT = 8
WARN_EVERY = 60.0
"""Seconds between two warnings that summarise repeated refusals."""
SLOW_BODY_REFUSED = "hyde_plus.slow_body_refused"
"""The scope key `_Protocol` sets on a request refused for too many slow bodies."""


class ServeError(RuntimeError):
    """The server cannot start (address in use, bad host or port...); the message
    names the problem and the fix, in one line."""


@dataclass(frozen=True)
class Limits:
    """The HTTP server's limits (see the module docstring and the RCP page): requests
    in flight, open connections, seconds to send a head and a body, keep-alive, body
    size, and bodies still arriving per client address. A count below 1 or a time
    that is not above 0 is a `ValueError`."""

    max_inflight: int = DEFAULT_MAX_INFLIGHT
    """Requests served at once; more get HTTP 503 / -32010 with ``Retry-After``."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Open connections; more are answered 503 and closed."""
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    """Seconds a connection has to send a whole request head (else 408, closed)."""
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    """Seconds a request has to send its body (else 408 / -32014, closed)."""
    keep_alive: int = DEFAULT_KEEP_ALIVE
    """Seconds an idle keep-alive connection stays open."""
    max_body_bytes: int = MAX_BODY_BYTES
    """Largest body, announced or streamed (else 413 / -32013, closed)."""
    slow_bodies_per_client: int = DEFAULT_SLOW_BODIES_PER_CLIENT
    """Requests per client address whose body is still arriving; more get 503 and are
    closed."""

    def __post_init__(self) -> None:
        for name in (
            "max_inflight",
            "max_connections",
            "max_body_bytes",
            "slow_bodies_per_client",
        ):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1")
        for name in ("header_timeout", "body_timeout", "keep_alive"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds")


def _error_body(code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


def _raw_response(status: int, reason: str, body: bytes) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, written outside h11
    (used where no request has been parsed yet)."""
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def check_token(token: str) -> None:
    """Refuse a bearer token that cannot travel unchanged in an HTTP header: it must
    be printable ASCII without spaces (RFC 6750), so the bytes a client sends can be
    compared with it exactly.

    Args:
        token: the token; an empty or unfit one is a `ValueError`.
    """
    if not token:
        raise ValueError("token must not be empty (None serves without authentication)")
    bad = next((c for c in token if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ValueError(
            f"token must be printable ASCII without spaces (it travels in an HTTP header), "
            f"not {bad!r}; e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


class RepeatedWarning:
    """One WARNING per ``every`` seconds for an event that may repeat thousands of
    times (a flood of refusals), with the count since the last one: ``message`` is
    formatted with ``count``.

    Args:
        message: a logging format with one ``%d``, the count.
        every: seconds between two warnings.
        clock: the time source, in seconds.
    """

    def __init__(
        self,
        message: str,
        every: float = WARN_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.message = message
        self.every = every
        self.clock = clock
        self.pending = 0
        self._last: float | None = None

    def note(self) -> None:
        """Count one occurrence; warn with the count so far when none was logged yet or
        ``every`` seconds have passed since the last warning."""
        self.pending += 1
        now = self.clock()
        if self._last is not None and now - self._last < self.every:
            return
        logger.warning(self.message, self.pending)
        self.pending = 0
        self._last = now


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline, a connection cap, a cap on
    slow bodies per client and JSON-RPC bodies on its own 400s; `limits` and the shared
    counters are set per server by `_protocol_class`."""

    limits: ClassVar[Limits]
    slow_bodies: ClassVar[Counter[str]]
    refused_connections: ClassVar[RepeatedWarning]
    refused_bodies: ClassVar[RepeatedWarning]
    _head_timer: asyncio.TimerHandle | None = None
    _partial_head = False
    _awaiting_body = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.refused_connections.note()
            body = _error_body(
                rcp.Errc.BACKEND_UNAVAILABLE,
                f"too many open connections (limit {self.limits.max_connections}); retry later",
                {"retryable": True},
            )
            transport.write(_raw_response(503, "Service Unavailable", body))
            transport.close()
            return
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_head_timer()  # the request head is complete
        else:
            self._partial_head = True

    def handle_events(self) -> None:
        super().handle_events()
        self._track_body()

    def _track_body(self) -> None:
        """Count this connection against its client's slow bodies while the current
        request's head is in and its body is not (run after every parse, before the
        request's task can start); flag the request refused over the cap."""
        waiting = self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing()
        if waiting and not self._awaiting_body:
            self._awaiting_body = True
            host = self._client_host()
            self.slow_bodies[host] += 1
            if self.slow_bodies[host] > self.limits.slow_bodies_per_client:
                cast(dict[str, Any], self.scope)[SLOW_BODY_REFUSED] = True
                self.refused_bodies.note()
        elif not waiting:
            self._release_body()

    def _client_host(self) -> str:
        return str(self.client[0]) if self.client else "?"

    def _release_body(self) -> None:
        if self._awaiting_body:
            self._awaiting_body = False
            host = self._client_host()
            self.slow_bodies[host] -= 1
            if self.slow_bodies[host] <= 0:
                del self.slow_bodies[host]

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()  # waiting for the next request on keep-alive

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._release_body()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        body = _error_body(rcp.Errc.INVALID_REQUEST, f"invalid HTTP request: {msg}")
        self.transport.write(_raw_response(400, "Bad Request", body))
        self.transport.close()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._partial_head = False
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if not self._partial_head:  # an idle connection: just close it
            self.transport.close()
            return
        body = _error_body(
            rcp.Errc.TIMEOUT,
            f"no complete request head within {self.limits.header_timeout:g} s",
        )
        self.transport.write(_raw_response(408, "Request Timeout", body))
        self.transport.close()


def _protocol_class(limits: Limits) -> type[H11Protocol]:
    """`_Protocol` bound to ``limits``, with counters shared by this server's
    connections only."""
    shared = {
        "limits": limits,
        "slow_bodies": Counter(),
        "refused_connections": RepeatedWarning(
            f"rcp http: refused %d connection(s) over the cap of {limits.max_connections} "
            f"open connections (one warning a minute at most)"
        ),
        "refused_bodies": RepeatedWarning(
            f"rcp http: refused %d request(s) from clients with more than "
            f"{limits.slow_bodies_per_client} bodies still arriving (one warning a minute "
            "at most)"
        ),
    }
    return type("Protocol", (_Protocol,), shared)


class _BodyTooLarge(Exception):
    pass


class _Endpoint:
    """The ASGI endpoint: checks, reads the body, dispatches in a worker thread."""

    def __init__(
        self, server: RcpServer, token: str | None, limits: Limits, pool: ThreadPoolExecutor
    ) -> None:
        self.server = server
        self.token = token
        self.limits = limits
        self.pool = pool
        self.inflight = 0
        self.requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await self.respond(request)
        except ClientDisconnect:
            return  # the client is gone: nobody to answer
        except PROPAGATE:
            raise
        except BaseException as exc:  # the last line of defence: still JSON-RPC
            logger.warning("rcp: %s while answering", type(exc).__name__, exc_info=True)
            name = type(exc).__name__
            response = self.error(500, rcp.Errc.INTERNAL_ERROR, f"internal error ({name})")
        await response(scope, receive, send)

    @staticmethod
    def error(
        status: int,
        code: int,
        message: str,
        data: Any = None,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> Response:
        extra = dict(headers or {})
        if close:
            extra["Connection"] = "close"
        return Response(
            _error_body(code, message, data),
            status_code=status,
            media_type="application/json",
            headers=extra,
        )

    def _refusal(self, request: Request) -> Response | None:
        """The error response for a request refused before its body is read (wrong
        method, no token, ambiguous framing, too large, server busy); None to go on."""
        if request.method != "POST":
            return self.error(
                405,
                rcp.Errc.INVALID_REQUEST,
                "use POST with a JSON-RPC body",
                headers={"Allow": "POST"},
            )
        if not self._authorized(request):
            # close: the unread body must never be parsed as a next request
            return self.error(
                401,
                rcp.Errc.UNAUTHORIZED,
                "missing or wrong bearer token",
                headers={"WWW-Authenticate": "Bearer"},
                close=True,
            )
        announced = request.headers.get("content-length")
        if announced is not None and "transfer-encoding" in request.headers:
            # RFC 9112 6.3: both framings at once is a smuggling attempt; refuse it
            return self.error(
                400,
                rcp.Errc.INVALID_REQUEST,
                "Content-Length and Transfer-Encoding together are not accepted; send one",
                close=True,
            )
        if announced and announced.isdigit() and int(announced) > self.limits.max_body_bytes:
            return self._too_large()
        if request.scope.get(SLOW_BODY_REFUSED):
            return self._unavailable(
                f"too many requests from this address whose body is still arriving (limit "
                f"{self.limits.slow_bodies_per_client}); send each body whole, retry later"
            )
        return None

    def _busy(self) -> Response:
        return self._unavailable(
            f"server busy: {self.inflight} requests in flight (limit "
            f"{self.limits.max_inflight}); retry shortly"
        )

    def _unavailable(self, message: str) -> Response:
        """HTTP 503, retryable after a second, and the connection closed."""
        return self.error(
            503,
            rcp.Errc.BACKEND_UNAVAILABLE,
            message,
            {"retryable": True, "retryAfterMs": 1000},
            headers={"Retry-After": "1"},
            close=True,
        )

    def _authorized(self, request: Request) -> bool:
        """Whether the request carries the token, compared as the exact bytes sent
        (Starlette decodes header bytes as latin-1, so encoding back gives them)."""
        if self.token is None:
            return True
        sent = request.headers.get("authorization", "").encode("latin-1")
        return hmac.compare_digest(sent, f"Bearer {self.token}".encode("ascii"))

    async def _read(self, request: Request) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self) -> Response:
        limit = self.limits.max_body_bytes
        return self.error(
            413,
            rcp.Errc.PAYLOAD_TOO_LARGE,
            f"request body must be at most {limit} bytes",
            {"maxBytes": limit},
            close=True,
        )

    async def respond(self, request: Request) -> Response:
        self.requests += 1
        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:  # no in-flight slot yet: a body that trickles in must not hold one
            body = await asyncio.wait_for(self._read(request), self.limits.body_timeout)
        except _BodyTooLarge:
            return self._too_large()
        except asyncio.TimeoutError:
            return self.error(
                408,
                rcp.Errc.TIMEOUT,
                f"request body not received within {self.limits.body_timeout:g} s",
                close=True,
            )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return self.error(200, rcp.Errc.PARSE_ERROR, not_utf8(exc))
        if not text.strip():
            return self.error(200, rcp.Errc.INVALID_REQUEST, "empty request body")
        if self.inflight >= self.limits.max_inflight:
            return self._busy()
        self.inflight += 1
        try:
            loop = asyncio.get_running_loop()
            session = request.headers.get(SESSION_HEADER)
            reply = await loop.run_in_executor(self.pool, self.server.handle_line, text, session)
        finally:
            self.inflight -= 1
        if not reply:
            return Response(status_code=204)
        return Response(reply.encode(), status_code=200, media_type="application/json")


def bind_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6; port 0 picks a free
    one), or `ServeError` with a one-line reason and fix.

    Args:
        host: a name or an IPv4/IPv6 address of this machine.
        port: 0 to 65535; 0 picks a free port.
        backlog: connections the kernel queues before they are accepted.
    """
    if not is_int(port) or not 0 <= port <= 65535:
        raise ServeError(f"port {port} is out of range: use 1-65535 (0 picks a free port)")
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICSERV
        )
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ServeError(
            f"cannot resolve host {host!r} ({reason}): use an IP address of this machine, "
            "e.g. 127.0.0.1"
        ) from exc
    family, kind, proto, _, address = infos[0]
    try:
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        if family == socket.AF_INET6:
            raise ServeError(
                f"IPv6 is not available on this machine, so {host} cannot be served: "
                "use --host 127.0.0.1"
            ) from exc
        raise ServeError(f"cannot open a socket for {host}: {exc.strerror}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServeError(
                f"port {port} on {host} is already in use: stop the other server or choose "
                "another --http port"
            ) from exc
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ServeError(
                f"{host} is not an address of this machine: use 127.0.0.1 (this machine "
                "only) or one of its addresses"
            ) from exc
        if exc.errno == errno.EACCES:
            raise ServeError(
                f"permission denied to listen on port {port}: ports below 1024 need root, "
                "use a port from 1024 to 65535"
            ) from exc
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


class RcpHttpServer:
    """Serve an `RcpServer` over HTTP on ``host:port`` (0 picks a free port) with
    uvicorn: concurrent requests, optional bearer token, and the limits of `Limits`.

    Binds at construction (or serves ``sock`` from `bind_socket`), so a bad host or a
    busy port raises `ServeError` before anything is served. `serve_forever` runs in
    the calling thread (Ctrl-C stops it); `start` / `stop` run it in a background
    thread.

    Args:
        server: the RCP server whose `RcpServer.handle_line` answers each request.
        host: the address to listen on (IPv4 or IPv6).
        port: the port; 0 picks a free one.
        token: the bearer token every request must carry; None: no authentication.
        limits: the server's `Limits`; None: the defaults.
        threads: worker threads for the RCP dispatch; None: ``max_inflight``, at most
            32.
        sock: a listening socket from `bind_socket` to serve instead of binding
            ``host:port``.
    """

    def __init__(
        self,
        server: RcpServer,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        limits: Limits | None = None,
        threads: int | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        if token is not None:
            check_token(token)
        self.rcp_server = server
        self.token = token
        self.limits = limits or Limits()
        workers = threads or min(self.limits.max_inflight, 32)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rcp-http")
        self.endpoint = _Endpoint(server, token, self.limits, self._pool)
        self.app = Starlette(routes=[Route("/{path:path}", self.endpoint)])
        self._sock = sock if sock is not None else bind_socket(host, port)
        config = uvicorn.Config(
            self.app,
            http=_protocol_class(self.limits),
            ws="none",
            lifespan="off",
            log_config=None,
            log_level="error",  # not a warning per malformed request (log flooding)
            access_log=False,
            server_header=False,
            timeout_keep_alive=self.limits.keep_alive,
            timeout_graceful_shutdown=5,
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def requests(self) -> int:
        """HTTP requests answered by the endpoint so far."""
        return self.endpoint.requests

    @property
    def address(self) -> tuple[str, int]:
        """The host and port the server listens on (the port chosen when 0 was asked)."""
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """The endpoint's URL, ``http://host:port/rcp`` (an IPv6 host in brackets)."""
        host, port = self.address
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/rcp"

    def serve_forever(self) -> None:
        """Serve in this thread until Ctrl-C / SIGTERM (or `stop` from another)."""
        try:
            asyncio.run(self._uvicorn.serve(sockets=[self._sock]))
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def start(self, timeout: float = 10.0) -> RcpHttpServer:
        """Serve in a background thread (for tests and embedding in an app); returns
        once the server accepts requests, or raises `ServeError` when it stopped or did
        not start in time.

        Args:
            timeout: seconds to wait for the server to accept requests.
        """
        self._thread = threading.Thread(target=self.serve_forever, name="rcp-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive():
                raise ServeError("the HTTP server stopped during start-up")
            if time.monotonic() > deadline:
                raise ServeError(f"the HTTP server did not start within {timeout:g} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving (waits up to 10 s for the background thread) and close the
        socket."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sock.close()
