"""A Retrieval Context Protocol server: ``query/transform`` and ``retrieve`` over an index.

Built on the official ``rcp-protocol`` SDK: its ``rcp.Server`` does the JSON-RPC
framing, the ``initialize`` handshake, capability gating, central parameter
validation and error mapping; we register the handlers. `RcpServer` hardens that
dispatcher so that every frame gets a well-formed JSON-RPC answer and nothing a
client sends can crash the process: a frame over 1 MiB (-32013), JSON nested past
`MAX_DEPTH` levels (-32700 / -32600), a batch over `MAX_BATCH` calls (-32600), a
non-integer ``protocolVersion`` such as ``1e999`` (-32602), an ``id`` that is not a
string, number or null (-32600), and any unexpected error in the SDK (-32603).

Over stdio (`serve_stdio`) one client is served, with the SDK's session rules: one
handshake per session. Over HTTP (`rcp_http.RcpHttpServer`, uvicorn + Starlette)
the dispatcher is `HttpRcpServer`: HTTP is connectionless (the official client opens
a connection per call), so the state is *stateless after a valid handshake*: every
``initialize`` is judged on its own, only a successful one unlocks the gated methods,
and nothing a client sends afterwards (a bogus ``initialize``, a notification) can
lock other clients out again.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import IO, Any

import rcp
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.llms import LLM

from ._checks import is_int, is_number
from ._version import __version__
from .cache import MemoryCache, TransformCache
from .retriever import TransformRetriever
from .transforms.base import MAX_N, QueryTransformer, TransformResult
from .transforms.factory import build
from .transforms.registry import METHODS, transform_class
from .usage import Usage

logger = logging.getLogger(__name__)

DEFAULT_N = 3
MAX_K = 100
MAX_QUERY_CHARS = 2000
MAX_BODY_BYTES = 1 << 20
#: Most calls in one JSON-RPC batch.
MAX_BATCH = 64
#: Deepest nesting of arrays/objects accepted in one frame.
MAX_DEPTH = 64
PROPAGATE: tuple[type[BaseException], ...] = (
    KeyboardInterrupt,
    SystemExit,
    GeneratorExit,
    asyncio.CancelledError,
)
"""What a server lets through instead of answering: an interrupt, an exit, a
cancellation. Any other error, an ``Exception`` or not (gevent's ``Timeout`` is a
``BaseException``), is answered with -32603 and the server keeps serving."""


def not_utf8(exc: UnicodeDecodeError) -> str:
    """The -32700 message for a frame whose bytes are not UTF-8 (never decoded with
    replacement characters: the request would not be the one sent)."""
    return f"invalid JSON: the request is not UTF-8 text (byte {exc.start})"


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
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid("'query' MUST be valid Unicode text (no lone surrogates)", "query") from None
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


def transform_status(
    result: TransformResult | None, failed_searches: Sequence[str] = ()
) -> dict[str, Any]:
    """How the rewrite went, for the client (``_meta.transform`` of every
    ``query/transform`` and ``retrieve`` result): ``status`` is ``"applied"``,
    ``"fallback"`` (it failed, timed out or gave nothing usable: the question was used
    alone, ``reason`` says why), ``"skipped"`` (a guard chose the question alone, not a
    failure), ``"partial"`` (some searches of a fan-out failed; ``reason`` is the first
    error) or ``"none"`` (no rewrite was asked for)."""
    if result is None:
        return {"method": "none", "status": "none"}
    out: dict[str, Any] = {"method": result.method, "status": "applied"}
    if result.fallback:
        out.update(status="fallback", reason=result.error or "the transform failed")
    elif result.skipped:
        out.update(status="skipped", reason=result.skipped)
    elif failed_searches:
        out.update(status="partial", reason=failed_searches[0])
    if result.cached:
        out["cached"] = True
    return out


def _with_status(out: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """``out`` with the rewrite's status in ``_meta.transform`` and, for clients that
    keep only ``hits`` and ``usage`` (the SDK's ``search``), in ``usage.transformStatus``."""
    out["usage"]["transformStatus"] = status["status"]
    out["_meta"] = {"transform": status}
    return out


class TransformService:
    """The protocol-independent part: transforms by method and ``n``, and searches."""

    def __init__(
        self,
        llm: LLM | None,
        retriever: BaseRetriever | None = None,
        *,
        cache_entries: int = 4096,
        cache: TransformCache | None = None,
        timeout: float | None = None,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        modes: Sequence[str] = ("dense",),
    ) -> None:
        """``options`` maps a method name to its keyword options (as `hyde-plus tune`
        writes them), applied whenever that method's transform is built; ``modes`` are
        the search modes ``retrieve`` advertises (the store's: ``dense``, ``hybrid``);
        ``cache`` holds every transform's generations (a `KVStoreCache` on Redis is
        shared by every replica), else a per-process `MemoryCache` of
        ``cache_entries``."""
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError("timeout must be > 0 seconds (or None for the transforms' default)")
        self.llm = llm
        self.retriever = retriever
        self.modes = tuple(modes) or ("dense",)
        self.timeout = timeout
        self.options = {name: dict(opts) for name, opts in (options or {}).items()}
        self.cache: TransformCache = cache if cache is not None else MemoryCache(cache_entries)
        self._transforms: dict[tuple[str, int], QueryTransformer] = {}
        self._identity = build("none")
        self._retrievers: dict[int, TransformRetriever] = {}
        self._lock = threading.Lock()

    def transformer(self, method: str, n: int) -> QueryTransformer:
        key = (method, n if transform_class(method).count_option() == "n" else 0)
        with self._lock:
            found = self._transforms.get(key)
            if found is None:
                options: dict[str, Any] = dict(self.options.get(method, {}))
                if self.timeout is not None:
                    options["timeout"] = self.timeout
                if key[1]:
                    options["n"] = key[1]
                found = build(method, self.llm, options, cache=self.cache)
                self._transforms[key] = found
        return found

    def transform(self, query: str, method: str, n: int) -> TransformResult:
        return self.transformer(method, n).transform_safe(query)

    def search(self, query: str, method: str | None, n: int, k: int) -> Any:
        """Search with the ``method`` rewrite; the top ``k`` of the fused results.

        The wrapped retriever should fetch `MAX_K` candidates per search (``hyde-plus
        serve`` builds it so): fewer caps what any ``k`` can return. One
        `TransformRetriever` per transform is kept and reused, so its worker threads
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
    version: str = __version__,
    http: bool = False,
) -> RcpServer:
    """An `RcpServer` (`HttpRcpServer` with ``http=True``) advertising ``transform``
    (and ``retrieve``, with the store's modes, when the service has a retriever) with
    our handlers registered."""
    server: RcpServer = HttpRcpServer() if http else RcpServer()
    server.set_info(name, version)
    server.advertise(
        rcp.Capability.Transform,
        {"methods": list(METHODS), "maxN": MAX_N, "maxQueryChars": MAX_QUERY_CHARS},
    )
    server.on(rcp.Method.TRANSFORM)(lambda params: _transform(service, params))
    if service.retriever is not None:
        server.advertise(
            rcp.Capability.Retrieve,
            {"maxK": MAX_K, "rewrite": list(METHODS), "modes": list(service.modes)},
        )
        server.on(rcp.Method.RETRIEVE)(lambda params: _retrieve(service, params))
    return server


def _refuse_extra(params: dict[str, Any], allowed: frozenset[str]) -> None:
    extra = sorted(set(params) - allowed)
    if extra:
        raise _unsupported(f"unsupported option(s) {extra}", extra[0])


def _transform(service: TransformService, params: dict[str, Any]) -> dict[str, Any]:
    """``query/transform``: the rewrite, its usage and, for passages, the text."""
    _refuse_extra(params, TRANSFORM_OPTIONS)
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
    if result.hypothetical and not result.fallback:
        out["hypothetical"] = "\n\n".join(result.hypothetical)
    if result.fallback:
        out["fallback"] = True
    return _with_status(out, transform_status(result))


def _rewrite_spec(params: dict[str, Any], n: int) -> tuple[str | None, int]:
    """``(method or None, n)`` from ``rewrite``: a method name or ``{method, n}``."""
    rewrite = params.get("rewrite")
    if isinstance(rewrite, dict):
        spec = rewrite
        unknown = sorted(set(spec) - {"method", "n"})
        if unknown:
            raise _unsupported(f"unsupported rewrite option(s) {unknown}", f"rewrite.{unknown[0]}")
        if "method" not in spec:
            raise _invalid(
                "'rewrite' as an object needs a 'method' (one of "
                f'{", ".join(METHODS)}), e.g. {{"method": "multi-query", "n": 2}}',
                "rewrite.method",
            )
        rewrite = spec["method"]
        if not isinstance(rewrite, str):
            raise _invalid("'rewrite.method' MUST be a method name", "rewrite.method")
        if "n" in spec:
            rn = spec["n"]
            if not is_int(rn) or rn < 1:
                raise _invalid("'rewrite.n' MUST be an integer >= 1", "rewrite.n")
            n = min(rn, MAX_N)
    if rewrite is not None and not isinstance(rewrite, str):
        raise _invalid("'rewrite' MUST be a method name or {method, n}", "rewrite")
    if rewrite is not None and rewrite not in METHODS:
        raise _unsupported(f"rewrite '{rewrite}' is not advertised", "rewrite", list(METHODS))
    return rewrite, n


def _retrieve(service: TransformService, params: dict[str, Any]) -> dict[str, Any]:
    """``retrieve``: the top ``k`` hits, searched with the ``rewrite`` if any."""
    _refuse_extra(params, RETRIEVE_OPTIONS)
    query = _query(params)
    k = _count(params, "k", 10, MAX_K)
    rewrite, n = _rewrite_spec(params, _count(params, "n", DEFAULT_N, MAX_N))
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
    status = transform_status(t if rewrite else None, result.failed_searches)
    if rewrite:
        out["rewrite"] = {
            "method": rewrite,
            "queries": list(t.search_queries),
            "hypothetical": list(t.hypothetical),
            "fallback": t.fallback,
            "status": status["status"],
        }
        if "reason" in status:
            out["rewrite"]["reason"] = status["reason"]
    return _with_status(out, status)


def _error(id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": error}


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by 0.0 (NaN/Infinity are not JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else 0.0
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(message: Any) -> str:
    """Compact, strictly valid JSON (the SDK's wire format)."""
    return json.dumps(_finite(message), separators=(",", ":"), allow_nan=False)


def error_frame(code: int, message: str, data: Any = None, id_: Any = None) -> str:
    """One JSON-RPC error response, serialised."""
    return dumps(_error(id_, code, message, data))


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays/objects more than ``limit`` levels (iterative:
    no recursion, whatever the input)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _valid_id(value: Any) -> bool:
    if value is None or isinstance(value, str) or is_int(value):
        return True
    return is_number(value) and math.isfinite(value)


def _wrong_version(request: dict[str, Any]) -> dict[str, Any] | None:
    """Invalid Request for a call whose ``jsonrpc`` is not exactly ``"2.0"`` (``"1.0"``,
    missing, a number); nothing for such a notification, which is never answered."""
    if "id" not in request:
        return None
    id_ = request["id"] if _valid_id(request["id"]) else None
    return _error(
        id_,
        rcp.Errc.INVALID_REQUEST,
        "'jsonrpc' MUST be exactly \"2.0\" (this server speaks JSON-RPC 2.0 only)",
        {"field": "jsonrpc"},
    )


class RcpServer(rcp.Server):  # type: ignore[misc]
    """``rcp.Server`` that answers every frame and never raises.

    Dispatch stays the SDK's; in front of it every frame is checked for what the SDK
    does not survive or should not accept: size, nesting depth, batch size, the type
    of ``id``, ``params`` and ``initialize``'s ``protocolVersion``. Any exception left
    becomes -32603 for that request, whether an ``Exception`` or not, except `PROPAGATE`
    (interrupts, exits, cancellation). Notifications (no ``id``) are never answered and
    never change state.
    """

    max_batch = MAX_BATCH
    max_depth = MAX_DEPTH
    max_bytes = MAX_BODY_BYTES
    _initialized: bool  # the SDK's handshake flag

    def __init__(self) -> None:
        super().__init__()
        self.shutdown_requested = False

    def handle(self, request: Any) -> Any:
        id_: Any = None
        if isinstance(request, dict) and isinstance(request.get("method"), str):
            if request.get("jsonrpc") != "2.0":
                return _wrong_version(request)
            if request["method"] == rcp.Method.SHUTDOWN:
                self.shutdown_requested = True
            if "id" not in request:
                return None  # a notification: never answered (§4.5), never acted on
            if not _valid_id(request["id"]):
                return _error(
                    None,
                    rcp.Errc.INVALID_REQUEST,
                    "'id' MUST be a string, an integer, a finite number or null",
                )
            id_ = request["id"]
            params = request.get("params")
            if params is None:
                request = {**request, "params": {}}
            elif not isinstance(params, dict):
                return _error(
                    id_, rcp.Errc.INVALID_PARAMS, "'params' MUST be an object", {"field": "params"}
                )
            elif request["method"] == rcp.Method.INITIALIZE and "protocolVersion" in params:
                version = params["protocolVersion"]
                if not is_int(version):
                    return _error(
                        id_,
                        rcp.Errc.INVALID_PARAMS,
                        f"'protocolVersion' MUST be an integer (this server speaks "
                        f"{rcp.PROTOCOL_VERSION})",
                        {"field": "protocolVersion"},
                    )
        try:
            return self._dispatch_request(request)
        except PROPAGATE:
            raise
        except BaseException as exc:  # the SDK promises "never raises"; hold it to that
            logger.warning("rcp: %s while handling a request", type(exc).__name__, exc_info=True)
            return _error(id_, rcp.Errc.INTERNAL_ERROR, f"internal error ({type(exc).__name__})")

    def _dispatch_request(self, request: Any) -> Any:
        return super().handle(request)

    def handle_line(self, line: str) -> str:
        """One frame (a request, a notification or a batch) -> the reply text ("" when
        nothing is to be answered). Never raises."""
        try:
            return self._handle_line(line)
        except PROPAGATE:
            raise
        except BaseException as exc:  # pragma: no cover - last resort
            logger.warning("rcp: %s while handling a frame", type(exc).__name__, exc_info=True)
            return error_frame(rcp.Errc.INTERNAL_ERROR, f"internal error ({type(exc).__name__})")

    def _handle_line(self, line: str) -> str:
        if len(line) > self.max_bytes:
            return error_frame(
                rcp.Errc.PAYLOAD_TOO_LARGE,
                f"request must be at most {self.max_bytes} bytes",
                {"maxBytes": self.max_bytes},
            )
        try:
            message = json.loads(line)
        except RecursionError:
            return error_frame(
                rcp.Errc.PARSE_ERROR,
                f"JSON nested too deeply (at most {self.max_depth} levels)",
                {"maxDepth": self.max_depth},
            )
        except ValueError as exc:  # also a number with more than 4300 digits
            return error_frame(rcp.Errc.PARSE_ERROR, f"invalid JSON: {exc}")
        if isinstance(message, (dict, list)) and _too_deep(message, self.max_depth):
            return error_frame(
                rcp.Errc.INVALID_REQUEST,
                f"request nested deeper than {self.max_depth} levels",
                {"maxDepth": self.max_depth},
            )
        if isinstance(message, list):
            if not message:
                return error_frame(rcp.Errc.INVALID_REQUEST, "empty batch")
            if len(message) > self.max_batch:
                return error_frame(
                    rcp.Errc.INVALID_REQUEST,
                    f"batch of {len(message)} calls is over the limit of {self.max_batch}; "
                    "split it into smaller batches",
                    {"maxBatch": self.max_batch},
                )
            replies = [r for r in (self.handle(item) for item in message) if r is not None]
            return dumps(replies) if replies else ""
        reply = self.handle(message)
        return dumps(reply) if reply is not None else ""


class HttpRcpServer(RcpServer):
    """`RcpServer` for connectionless HTTP: stateless after a valid handshake.

    Every ``initialize`` is judged on a throwaway copy of the session, so any client
    may handshake (again) and a bogus one (version 0, ``1e999``, a notification) only
    gets its own error. The first successful handshake unlocks the gated methods for
    good; before it they get -32001. The flag only ever goes from locked to unlocked,
    so no client can lock the others out, and requests served concurrently from
    several threads never see it flip back.
    """

    def _dispatch_request(self, request: Any) -> Any:
        if isinstance(request, dict) and request.get("method") == rcp.Method.INITIALIZE:
            probe = copy.copy(self)
            probe._initialized = False
            reply = rcp.Server.handle(probe, request)
            if probe._initialized:
                self._initialized = True
            return reply
        return super()._dispatch_request(request)


def _silence_stdout() -> None:
    """The peer closed our stdout: point it at /dev/null so that Python's exit-time
    flush does not print a BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def serve_stdio(
    server: rcp.Server,
    before: Callable[[], None] | None = None,
    *,
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
) -> None:
    """Serve one client, newline-delimited JSON-RPC on stdin/stdout, until
    ``shutdown`` or end of input. Every frame gets its answer (see `RcpServer`); a line
    over 1 MiB is skipped with -32013; a closed stdout ends the loop quietly."""
    if before is not None:
        before()
    source = stdin if stdin is not None else sys.stdin.buffer
    sink = stdout if stdout is not None else sys.stdout.buffer
    hardened = isinstance(server, RcpServer)
    limit = MAX_BODY_BYTES
    while True:
        raw = source.readline(limit + 1)
        if not raw:
            return
        if len(raw) > limit and not raw.endswith(b"\n"):
            while True:  # drop the rest of the oversized line
                more = source.readline(1 << 16)
                if not more or more.endswith(b"\n"):
                    break
            reply = error_frame(
                rcp.Errc.PAYLOAD_TOO_LARGE,
                f"request must be at most {limit} bytes",
                {"maxBytes": limit},
            )
        else:
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                reply = error_frame(rcp.Errc.PARSE_ERROR, not_utf8(exc))
            else:
                if not line:
                    continue
                reply = server.handle_line(line)
        if reply:
            try:
                sink.write((reply + "\n").encode("utf-8"))
                sink.flush()
            except (BrokenPipeError, OSError):
                if stdout is None:
                    _silence_stdout()
                return  # the client is gone
        if hardened and server.shutdown_requested:
            return
