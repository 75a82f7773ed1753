"""A Retrieval Context Protocol server: ``query/transform`` and ``retrieve`` over an index.

Built on the official ``rcp-protocol`` SDK: its ``rcp.Server`` does the JSON-RPC
framing, the ``initialize`` handshake, capability gating, central parameter
validation and error mapping; we register the handlers. Over stdio it serves one
client (the SDK's own loop). Over HTTP we put a threaded server in front of the SDK's
dispatcher, because the SDK's ``serve_http`` handles one connection at a time and has
no authentication: ours serves requests concurrently, binds 127.0.0.1 by default,
refuses requests without the bearer token when one is set (HTTP 401, RCP -32012), and
refuses bodies over 1 MiB (HTTP 413, RCP -32013). HTTP is connectionless, so every HTTP
client may ``initialize`` (the SDK would refuse a second handshake in one session);
before any handshake, gated calls still get -32001.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import rcp
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.llms import LLM

from .cache import MemoryCache
from .retriever import TransformRetriever
from .transforms.base import QueryTransformer, TransformResult
from .transforms.registry import METHODS, make_transform
from .usage import Usage

logger = logging.getLogger("llama_index_hyde_plus")

MAX_N = 10
DEFAULT_N = 3
MAX_K = 100
MAX_QUERY_CHARS = 2000
MAX_BODY_BYTES = 1 << 20
RETRIEVE_OPTIONS = frozenset({"query", "k", "rewrite", "n", "_meta"})
TRANSFORM_OPTIONS = frozenset({"query", "method", "n", "_meta"})


def _invalid(message: str, field: str) -> rcp.RcpError:
    return rcp.RcpError(rcp.Errc.INVALID_PARAMS, message, {"field": field})


def _unsupported(message: str, field: str, supported: list[str] | None = None) -> rcp.RcpError:
    data: dict[str, Any] = {"field": field}
    if supported is not None:
        data["supported"] = supported
    return rcp.RcpError(rcp.Errc.OPTION_UNSUPPORTED, message, data)


def _query(params: dict[str, Any]) -> str:
    query = params.get("query")
    if not isinstance(query, str):
        raise _invalid("'query' MUST be a string", "query")
    if not query.strip():
        raise _invalid("'query' MUST NOT be empty", "query")
    if len(query) > MAX_QUERY_CHARS:
        raise _invalid(f"'query' MUST be at most {MAX_QUERY_CHARS} characters", "query")
    return query


def _usage(usage: Usage, latency_s: float, cached: bool = False) -> dict[str, Any]:
    return {
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "totalTokens": usage.total_tokens,
        "llmCalls": usage.calls,
        "cost": usage.cost,
        "usageSource": usage.usage_source,
        "costSource": usage.cost_source,
        "cached": cached,
        "latencyMs": round(latency_s * 1000, 3),
    }


class TransformService:
    """The protocol-independent part: transforms by method and ``n``, and searches."""

    def __init__(
        self, llm: LLM | None, retriever: BaseRetriever | None = None, *, cache_entries: int = 4096
    ) -> None:
        self.llm = llm
        self.retriever = retriever
        self.cache = MemoryCache(cache_entries)
        self._transforms: dict[tuple[str, int], QueryTransformer] = {}
        self._identity = make_transform("none")
        self._retrievers: dict[int, TransformRetriever] = {}
        self._lock = threading.Lock()

    def transformer(self, method: str, n: int) -> QueryTransformer:
        key = (method, n if method in ("multi-query", "decompose") else 0)
        with self._lock:
            found = self._transforms.get(key)
            if found is None:
                options: dict[str, Any] = {"cache": self.cache}
                if key[1]:
                    options["n"] = key[1]
                found = self._transforms[key] = make_transform(method, self.llm, **options)
        return found

    def transform(self, query: str, method: str, n: int) -> TransformResult:
        return self.transformer(method, n).transform_safe(query)

    def search(self, query: str, method: str | None, n: int, k: int) -> Any:
        """Search with the ``method`` rewrite; the top ``k`` of the fused results.

        One `TransformRetriever` per transform is kept and reused, so its worker threads
        and its one-time warnings are not recreated on every request.
        """
        assert self.retriever is not None
        transformer = self.transformer(method, n) if method else self._identity
        with self._lock:
            retriever = self._retrievers.get(id(transformer))
            if retriever is None:
                retriever = TransformRetriever(self.retriever, transformer)
                self._retrievers[id(transformer)] = retriever
        result = retriever.search(query)
        return replace(result, nodes=result.nodes[:k])


def _count(params: dict[str, Any], field: str, default: int, maximum: int) -> int:
    value = params.get(field, default)
    # type and sign are checked centrally by the SDK (-32602); the range is clamped
    return min(int(value), maximum)


def build_server(
    service: TransformService,
    *,
    name: str = "hyde-plus",
    version: str = "0.1.0",
    http: bool = False,
) -> rcp.Server:
    """An ``rcp.Server`` advertising ``transform`` (and ``retrieve`` when the service
    has a retriever) with our handlers registered."""
    server: rcp.Server = _HttpServerSession() if http else rcp.Server()
    server.set_info(name, version)
    server.advertise(
        rcp.Capability.Transform,
        {
            "methods": list(METHODS),
            "maxN": MAX_N,
            "maxQueryChars": MAX_QUERY_CHARS,
        },
    )

    @server.on(rcp.Method.TRANSFORM)  # type: ignore[untyped-decorator]
    def query_transform(params: dict[str, Any]) -> dict[str, Any]:
        extra = sorted(set(params) - TRANSFORM_OPTIONS)
        if extra:
            raise _unsupported(f"unsupported option(s) {extra}", extra[0])
        query = _query(params)
        method = params.get("method")
        if not isinstance(method, str):
            raise _invalid("'method' MUST be a string", "method")
        if method not in METHODS:
            raise _unsupported(
                f"transform method '{method}' is not advertised", "method", list(METHODS)
            )
        n = _count(params, "n", DEFAULT_N, MAX_N)
        start = time.perf_counter()
        result = service.transform(query, method, n)
        out: dict[str, Any] = {
            "queries": list(result.queries),
            "usage": _usage(result.usage, time.perf_counter() - start, result.cached),
        }
        if method == "hyde" and not result.fallback:
            out["hypothetical"] = "\n\n".join(result.hypothetical)
        if result.fallback:
            out["fallback"] = True
        return out

    if service.retriever is not None:
        server.advertise(
            rcp.Capability.Retrieve,
            {
                "maxK": MAX_K,
                "rewrite": list(METHODS),
                "modes": ["dense"],
            },
        )

        @server.on(rcp.Method.RETRIEVE)  # type: ignore[untyped-decorator]
        def retrieve(params: dict[str, Any]) -> dict[str, Any]:
            extra = sorted(set(params) - RETRIEVE_OPTIONS)
            if extra:
                raise _unsupported(f"unsupported option(s) {extra}", extra[0])
            query = _query(params)
            k = _count(params, "k", 10, MAX_K)
            n = _count(params, "n", DEFAULT_N, MAX_N)
            rewrite = params.get("rewrite")
            if isinstance(rewrite, dict):
                spec, rewrite = rewrite, rewrite.get("method")
                if "n" in spec:
                    rn = spec["n"]
                    if isinstance(rn, bool) or not isinstance(rn, int) or rn < 1:
                        raise _invalid("'rewrite.n' MUST be an integer >= 1", "rewrite.n")
                    n = min(rn, MAX_N)
            if rewrite is not None and not isinstance(rewrite, str):
                raise _invalid("'rewrite' MUST be a method name or {method, n}", "rewrite")
            if rewrite is not None and rewrite not in METHODS:
                raise _unsupported(
                    f"rewrite '{rewrite}' is not advertised", "rewrite", list(METHODS)
                )
            start = time.perf_counter()
            result = service.search(query, rewrite, n, k)
            t = result.transform
            hits = [
                {
                    "id": item.node.node_id,
                    "score": float(item.score or 0.0),
                    "text": item.node.get_content(),
                }
                for item in result.nodes
            ]
            out: dict[str, Any] = {
                "hits": hits,
                "usage": _usage(t.usage, time.perf_counter() - start, t.cached),
            }
            if rewrite:
                out["rewrite"] = {
                    "method": rewrite,
                    "queries": list(t.search_queries),
                    "hypothetical": list(t.hypothetical),
                    "fallback": t.fallback,
                }
            return out

    return server


class _HttpServerSession(rcp.Server):  # type: ignore[misc]
    """``rcp.Server`` for connectionless HTTP: any client may ``initialize``."""

    def handle(self, request: Any) -> Any:
        if isinstance(request, dict) and request.get("method") == rcp.Method.INITIALIZE:
            self._initialized = False
        return super().handle(request)


class _ThreadingServer(ThreadingHTTPServer):
    # the stdlib default backlog (5) makes bursts of clients wait for SYN retries (1 s)
    request_queue_size = 256
    daemon_threads = True


class RcpHttpServer:
    """Serve an ``rcp.Server`` over HTTP on ``host:port`` (0 picks a free port), with
    concurrent requests and optional bearer-token authentication."""

    def __init__(
        self,
        server: rcp.Server,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
    ) -> None:
        self.rcp_server = server
        self.token = token
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("rcp http: " + format, *args)

            def _send(
                self, status: int, payload: bytes | None, extra: dict[str, str] | None = None
            ) -> None:
                self.send_response(status)
                for key, value in (extra or {}).items():
                    self.send_header(key, value)
                if payload is None:
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _error(
                self, status: int, code: int, message: str, extra: dict[str, str] | None = None
            ) -> None:
                body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
                self._send(status, json.dumps(body).encode(), extra)

            def do_POST(self) -> None:
                outer.requests += 1
                if outer.token is not None:
                    sent = self.headers.get("Authorization", "")
                    expected = f"Bearer {outer.token}"
                    if not hmac.compare_digest(sent.encode(), expected.encode()):
                        self._error(
                            401,
                            rcp.Errc.UNAUTHORIZED,
                            "missing or wrong bearer token",
                            {"WWW-Authenticate": "Bearer"},
                        )
                        return
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                except ValueError:
                    length = -1
                if length < 0 or length > MAX_BODY_BYTES:
                    self.close_connection = True
                    self._error(
                        413,
                        rcp.Errc.PAYLOAD_TOO_LARGE,
                        f"request body must be at most {MAX_BODY_BYTES} bytes",
                    )
                    return
                text = self.rfile.read(length).decode("utf-8", "replace") or "{}"
                reply = outer.rcp_server.handle_line(text)
                self._send(200, reply.encode()) if reply else self._send(204, None)

            def do_GET(self) -> None:
                self._error(
                    405,
                    rcp.Errc.INVALID_REQUEST,
                    "use POST with a JSON-RPC body",
                    {"Allow": "POST"},
                )

        self._httpd = _ThreadingServer((host, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/rcp"

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def start(self) -> RcpHttpServer:
        """Serve in a background thread (for tests and embedding in an app)."""
        self._thread = threading.Thread(target=self.serve_forever, name="rcp-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def serve_stdio(server: rcp.Server, before: Callable[[], None] | None = None) -> None:
    """Serve one client over stdin/stdout with the SDK's own loop."""
    if before is not None:
        before()
    server.serve_stdio()
