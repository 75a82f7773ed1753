"""A Retrieval Context Protocol server: ``query/transform``, ``retrieve`` over an index
(in each mode its store has), ``rerank`` with the embedding model, and, served
``--writable``, ``index/add`` / ``index/delete`` (see `index_writes`).

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
the dispatcher is `HttpRcpServer`. HTTP is connectionless (the official client opens
a connection per call and sends no session), so sessions are the spec's (§5.2): a
successful ``initialize`` issues a token in ``result._meta.session``; a request that
sends it back in the `SESSION_HEADER` (``RCP-Session``) header is in that session,
where a second ``initialize`` is -32600 (§13). Requests without one are, by default,
*stateless after a valid handshake*: every ``initialize`` is judged on its own, only a
successful one unlocks the gated methods, and nothing a client sends afterwards (a
bogus ``initialize``, a notification) can lock other clients out again; with
``sessionless="shared"`` they are one session for the whole server instead (the
reference SDK's HTTP model, which the protocol's conformance harness expects).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import IO, Any, Literal, get_args

import numpy as np
import rcp
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.llms import LLM

from .._checks import is_int, is_number
from .._version import __version__
from ..caching.cache import MemoryCache, TransformCache
from ..search.retriever import TransformRetriever
from ..stores.nodes import embedding_model_name
from ..transforms.base import MAX_N, QueryTransformer, TransformResult
from ..transforms.condense import chat_history, read_messages
from ..transforms.factory import build
from ..transforms.registry import METHODS, entry_for
from ..usage import Usage

logger = logging.getLogger(__name__)

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


RETRIEVE_OPTIONS = frozenset({"query", "k", "rewrite", "n", "mode", "strict", "_meta"})
TRANSFORM_OPTIONS = frozenset({"query", "method", "n", "_meta"})
RERANK_OPTIONS = frozenset({"query", "passages", "documents", "method", "topN", "_meta"})
INDEX_ADD_OPTIONS = frozenset({"documents", "chunk", "contextual", "_meta"})
INDEX_DELETE_OPTIONS = frozenset({"ids", "_meta"})
#: Most passages one ``rerank`` scores.
MAX_RERANK = 256


def _invalid(message: str, field: str) -> rcp.RcpError:
    return rcp.RcpError(rcp.Errc.INVALID_PARAMS, message, {"field": field})


def _unsupported(message: str, field: str, supported: list[str] | None = None) -> rcp.RcpError:
    data: dict[str, Any] = {"field": field, "option": field}
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
    """The protocol-independent part: transforms by method and ``n``, searches, reranks
    and (with a ``writer``) index writes."""

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
        mode_retrievers: Mapping[str, BaseRetriever] | None = None,
        embed_model: BaseEmbedding | None = None,
        writer: Any = None,
    ) -> None:
        """``options`` maps a method name to its keyword options (as `hyde-plus tune`
        writes them), applied whenever that method's transform is built; ``modes`` are
        the search modes ``retrieve`` advertises (the store's: ``dense``, ``hybrid``),
        the first one searched by ``retriever`` and each other one by its entry in
        ``mode_retrievers``. ``embed_model`` (the index's, or a transform-only server's
        ``--embed``) offers ``rerank``; ``writer`` (an `index_writes.MilvusWriter`)
        offers a writable ``index``. ``cache`` holds every transform's generations (a
        `KVStoreCache` on Redis is shared by every replica), else a per-process
        `MemoryCache` of ``cache_entries``."""
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError("timeout must be > 0 seconds (or None for the transforms' default)")
        self.llm = llm
        self.retriever = retriever
        self.modes = tuple(modes) or ("dense",)
        extra = dict(mode_retrievers or {})
        missing = [m for m in self.modes[1:] if m not in extra]
        if retriever is not None and missing:
            raise ValueError(f"no retriever for the mode(s) {missing} (mode_retrievers)")
        self.mode_retrievers: dict[str, BaseRetriever] = (
            {self.modes[0]: retriever, **extra} if retriever is not None else {}
        )
        self.embed_model = embed_model
        self.writer = writer
        self.timeout = timeout
        self.options = {name: dict(opts) for name, opts in (options or {}).items()}
        self.cache: TransformCache = cache if cache is not None else MemoryCache(cache_entries)
        self._transforms: dict[tuple[str, int], QueryTransformer] = {}
        self._identity = build("none")
        self._retrievers: dict[tuple[int, int], TransformRetriever] = {}
        self._lock = threading.Lock()

    def transformer(self, method: str, n: int | None) -> QueryTransformer:
        """The ``method`` transform writing ``n`` queries or passages (its count option,
        `registry.Entry.count`: ``n``, HyDE's ``num_passages``); None: its own default."""
        option = entry_for(method).count
        key = (method, n if option is not None and n is not None else 0)
        with self._lock:
            found = self._transforms.get(key)
            if found is None:
                options: dict[str, Any] = dict(self.options.get(method, {}))
                if self.timeout is not None:
                    options["timeout"] = self.timeout
                if option is not None and key[1]:
                    options[option] = key[1]
                found = build(method, self.llm, options, cache=self.cache)
                self._transforms[key] = found
        return found

    def transform(
        self, query: str, method: str, n: int | None, history: list[ChatMessage] | None = None
    ) -> TransformResult:
        """The ``method`` rewrite of ``query``; ``history``: the conversation so far,
        read by `Condense` (the other methods do not use one)."""
        if history is None:
            return self.transformer(method, n).transform_safe(query)
        with chat_history(history):
            return self.transformer(method, n).transform_safe(query)

    def search(
        self, query: str, method: str | None, n: int | None, k: int, mode: str | None = None
    ) -> Any:
        """Search in ``mode`` (default: the first of `modes`) with the ``method``
        rewrite; the top ``k`` of the fused results.

        The wrapped retriever should fetch `MAX_K` candidates per search (``hyde-plus
        serve`` builds it so): fewer caps what any ``k`` can return. One
        `TransformRetriever` per transform and mode is kept and reused, so its worker
        threads and its one-time warnings are not recreated on every request.
        """
        assert self.retriever is not None
        base = self.mode_retrievers[mode or self.modes[0]]
        transformer = self.transformer(method, n) if method else self._identity
        key = (id(transformer), id(base))
        with self._lock:
            retriever = self._retrievers.get(key)
            if retriever is None:
                retriever = TransformRetriever(base, transformer)
                self._retrievers[key] = retriever
        result = retriever.search(query)
        return replace(result, nodes=result.nodes[:k])

    def rerank(self, query: str, passages: Sequence[str]) -> list[float]:
        """The cosine of each passage to ``query`` with `embed_model` (a bi-encoder:
        the query embedded as a query, the passages as texts), in input order."""
        assert self.embed_model is not None
        return cosine_scores(
            self.embed_model.get_query_embedding(query),
            self.embed_model.get_text_embedding_batch(list(passages)),
        )


def cosine_scores(query: Sequence[float], vectors: Sequence[Sequence[float]]) -> list[float]:
    """The cosine similarity of each of ``vectors`` to ``query`` (0.0 for a zero vector)."""
    q = np.asarray(query, dtype=np.float64)
    if not len(vectors):
        return []
    m = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(m, axis=1) * np.linalg.norm(q)
    dots = m @ q
    safe = np.where(norms > 0, norms, 1.0)
    return [float(x) for x in np.where(norms > 0, dots / safe, 0.0)]


def _count(params: dict[str, Any], field: str, default: int, maximum: int) -> int:
    value = params.get(field, default)
    # type and sign are checked centrally by the SDK (-32602); the range is clamped
    return min(int(value), maximum)


def _given_count(params: dict[str, Any]) -> int | None:
    """``n`` clamped to `MAX_N`, or None when not given: the method's own default
    (three queries for multi-query and decompose, one passage for hyde, or what the
    server's options for the method say)."""
    return _count(params, "n", 1, MAX_N) if "n" in params else None


def build_server(
    service: TransformService,
    *,
    name: str = "hyde-plus",
    version: str = __version__,
    http: bool = False,
    sessionless: Sessionless = "stateless",
    session_key: bytes | None = None,
) -> RcpServer:
    """An `RcpServer` (`HttpRcpServer` with ``http=True``, with its ``sessionless``
    policy and ``session_key``) advertising ``transform`` (and ``retrieve``, with the
    store's modes, when the service has a retriever) with our handlers registered."""
    server: RcpServer = (
        HttpRcpServer(sessionless=sessionless, session_key=session_key) if http else RcpServer()
    )
    server.set_info(name, version)
    server.advertise(
        rcp.Capability.Transform,
        {
            "methods": list(METHODS),
            "maxN": MAX_N,
            "maxQueryChars": MAX_QUERY_CHARS,
            "x-hyde-plus": {"chatHistory": CHAT_HISTORY, "maxMessages": MAX_HISTORY_MESSAGES},
        },
    )
    server.on(rcp.Method.TRANSFORM)(lambda params: _transform(service, params))
    if service.retriever is not None:
        server.advertise(
            rcp.Capability.Retrieve,
            {
                "maxK": MAX_K,
                "rewrite": list(METHODS),
                "modes": list(service.modes),
                "defaultMode": service.modes[0],
            },
        )
        server.on(rcp.Method.RETRIEVE)(lambda params: _retrieve(service, params))
    if service.embed_model is not None:
        server.advertise(rcp.Capability.Rerank, rerank_capability(service.embed_model))
        server.on(rcp.Method.RERANK)(lambda params: _rerank(service, params))
    if service.writer is not None:
        server.advertise(
            rcp.Capability.Index,
            {
                "writable": True,
                "chunking": service.writer.chunking is not None,
                "contextual": False,
            },
        )
        server.on(rcp.Method.INDEX_ADD)(lambda params: _index_add(service, params))
        server.on(rcp.Method.INDEX_DELETE)(lambda params: _index_delete(service, params))
    server.set_conformance(conformance_level(service))
    return server


def conformance_level(service: TransformService) -> str:
    """The RCP level (§14) the server declares in ``_meta.conformance``: L2 with
    ``retrieve`` and ``rerank`` (and ``query/transform``), L1 with ``retrieve``, else
    L0. The protocol's harness holds the server to it."""
    if service.retriever is None:
        return "L0"
    return "L2" if service.embed_model is not None else "L1"


def rerank_capability(embed_model: BaseEmbedding) -> dict[str, Any]:
    """The ``rerank`` capability: no ``method`` of the spec's list (cross-encoder,
    colbert, llm) is offered, since the scoring is a bi-encoder's cosine, said in
    ``x-hyde-plus``; a request naming a method gets -32005."""
    return {
        "methods": [],
        "maxCandidates": MAX_RERANK,
        "models": [embedding_model_name(embed_model)],
        "x-hyde-plus": {
            "scoring": "bi-encoder",
            "detail": "cosine of the query embedding (as a query) to each passage's "
            "(as a text), with the index's embedding model; no cross-encoder is "
            "available offline",
        },
    }


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
    history = _history(params)
    start = time.perf_counter()
    result = service.transform(query, method, _given_count(params), history)
    out: dict[str, Any] = {
        # never empty over RCP: where nothing was generated (HyDE, a fallback, a
        # message searched as written) the query to search is the question itself
        "queries": list(result.queries) or [result.query],
        "usage": _usage(result.usage, time.perf_counter() - start, result.cached),
    }
    if result.hypothetical and not result.fallback:
        out["hypothetical"] = "\n\n".join(result.hypothetical)
    if result.fallback:
        out["fallback"] = True
    return _with_status(out, transform_status(result))


CHAT_HISTORY = "x-hyde-plus/chatHistory"
"""The ``_meta`` key of ``query/transform`` that carries the conversation so far, a
list of ``{"role": "user" | "assistant", "content": str}`` (the protocol's request has
no field for it, and ``_meta`` is where a server that does not know a key ignores it)."""

MAX_HISTORY_MESSAGES = 100
"""The most messages a request's `CHAT_HISTORY` may hold."""

MAX_HISTORY_CHARS = 20_000
"""The longest message a request's `CHAT_HISTORY` may hold."""


def _history(params: dict[str, Any]) -> list[ChatMessage] | None:
    """The conversation of ``params._meta`` (`CHAT_HISTORY`), or None; a bad one is
    -32602 naming the field."""
    meta = params.get("_meta")
    if not isinstance(meta, dict) or CHAT_HISTORY not in meta:
        return None
    field = f"_meta.{CHAT_HISTORY}"
    given = meta[CHAT_HISTORY]
    if isinstance(given, list) and len(given) > MAX_HISTORY_MESSAGES:
        raise _invalid(f"'{field}' MUST hold at most {MAX_HISTORY_MESSAGES} messages", field)
    try:
        messages = read_messages(given, field)
    except (TypeError, ValueError) as exc:
        raise _invalid(str(exc), field) from None
    for i, message in enumerate(messages):
        if len(message.content or "") > MAX_HISTORY_CHARS:
            raise _invalid(f"'{field}[{i}].content' is over {MAX_HISTORY_CHARS} characters", field)
    return messages


def _rewrite_spec(params: dict[str, Any], n: int | None) -> tuple[str | None, int | None]:
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


def _mode(service: TransformService, params: dict[str, Any]) -> tuple[str, list[str]]:
    """``(mode to search, usage notes)`` from ``mode`` and ``strict`` (§7.7): a mode
    that is not advertised is -32005, or, with ``"strict": false``, the default mode
    with a note saying so."""
    strict = params.get("strict", True)
    if not isinstance(strict, bool):
        raise _invalid("'strict' MUST be a boolean", "strict")
    mode = params.get("mode", service.modes[0])
    if not isinstance(mode, str):
        raise _invalid("'mode' MUST be a string", "mode")
    if mode in service.modes:
        return mode, []
    if strict:
        raise _unsupported(f"retrieve mode '{mode}' is not advertised", "mode", list(service.modes))
    return service.modes[0], [f"mode '{mode}' is not supported: searched {service.modes[0]}"]


def _retrieve(service: TransformService, params: dict[str, Any]) -> dict[str, Any]:
    """``retrieve``: the top ``k`` hits in ``mode``, searched with the ``rewrite`` if
    any."""
    _refuse_extra(params, RETRIEVE_OPTIONS)
    query = _query(params)
    k = _count(params, "k", 10, MAX_K)
    mode, notes = _mode(service, params)
    rewrite, n = _rewrite_spec(params, _given_count(params))
    start = time.perf_counter()
    result = service.search(query, rewrite, n, k, mode)
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
    out["usage"]["mode"] = mode
    if notes:
        out["usage"]["notes"] = notes
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


def _passages(params: dict[str, Any]) -> list[str]:
    """``passages`` (§7.6), or ``documents``, the name the protocol's harness sends."""
    if ("passages" in params) == ("documents" in params):
        raise _invalid("give exactly one of 'passages' and 'documents' (an array)", "passages")
    field = "passages" if "passages" in params else "documents"
    value = params[field]
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise _invalid(f"'{field}' MUST be an array of strings", field)
    if len(value) > MAX_RERANK:
        raise rcp.RcpError(
            rcp.Errc.PAYLOAD_TOO_LARGE,
            f"at most {MAX_RERANK} passages per rerank; split the call",
            {"field": field, "max": MAX_RERANK},
        )
    for i, text in enumerate(value):
        if len(text) > MAX_BODY_BYTES:  # pragma: no cover - the frame limit comes first
            raise _invalid(f"'{field}[{i}]' is too long", f"{field}[{i}]")
    return list(value)


def _rerank(service: TransformService, params: dict[str, Any]) -> dict[str, Any]:
    """``rerank`` (§7.6), a bi-encoder's: ``scores[i]`` is the cosine of passage ``i``
    to the query (input order, as the spec says); ``order`` the indices of the best
    ``topN`` (default: all), best first; ``results`` the same as ``{index, score}``,
    scores descending (ties keep input order)."""
    _refuse_extra(params, RERANK_OPTIONS)
    query = _query(params)
    passages = _passages(params)
    if "method" in params:
        method = params["method"]
        if not isinstance(method, str):
            raise _invalid("'method' MUST be a string", "method")
        raise _unsupported(
            f"rerank method '{method}' is not advertised (this server reranks with a "
            "bi-encoder: send no 'method')",
            "method",
            [],
        )
    top_n = _count(params, "topN", len(passages), len(passages))
    start = time.perf_counter()
    scores = service.rerank(query, passages) if passages else []
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
    return {
        "scores": scores,
        "order": order,
        "results": [{"index": i, "score": scores[i]} for i in order],
        "usage": {"latencyMs": round((time.perf_counter() - start) * 1000, 3)},
    }


def _write_error(exc: ValueError) -> rcp.RcpError:
    from .index_writes import WriteError

    if isinstance(exc, WriteError):
        code = rcp.Errc.PAYLOAD_TOO_LARGE if exc.too_large else rcp.Errc.INVALID_PARAMS
        return rcp.RcpError(code, str(exc), {"field": exc.field})
    return rcp.RcpError(rcp.Errc.BACKEND_UNAVAILABLE, f"the write failed: {exc}")


def _index_add(service: TransformService, params: dict[str, Any]) -> dict[str, Any]:
    """``index/add`` (§7.10): an upsert by id of whole documents, chunked as the index
    was built (``index.chunking``); ``ids`` in input order, ``chunks`` written."""
    from .index_writes import parse_documents

    _refuse_extra(params, INDEX_ADD_OPTIONS)
    writer = service.writer
    for option, offered in (("chunk", writer.chunking is not None), ("contextual", False)):
        if option in params:
            if not isinstance(params[option], bool):
                raise _invalid(f"'{option}' MUST be a boolean", option)
            if params[option] != offered:
                raise _unsupported(
                    f"'{option}': {str(params[option]).lower()} is not what this index does "
                    f"(index.{'chunking' if option == 'chunk' else option} is "
                    f"{str(offered).lower()}: every document is "
                    f"{'chunked as the index was built' if option == 'chunk' else 'added as is'})",
                    option,
                )
    if "documents" not in params:
        raise _invalid("'documents' is required", "documents")
    try:
        documents = parse_documents(params["documents"])
        result = writer.add(documents)
    except ValueError as exc:
        raise _write_error(exc) from exc
    return {"ids": result.ids, "chunks": result.chunks}


def _index_delete(service: TransformService, params: dict[str, Any]) -> dict[str, Any]:
    """``index/delete`` (§7.11): every chunk of each document; ``deleted`` counts the
    documents that were there (a repeat gets 0)."""
    from .index_writes import parse_ids

    _refuse_extra(params, INDEX_DELETE_OPTIONS)
    if "ids" not in params:
        raise _invalid("'ids' is required", "ids")
    try:
        return {"deleted": service.writer.delete(parse_ids(params["ids"]))}
    except ValueError as exc:
        raise _write_error(exc) from exc


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
    _negotiated: int  # the version the SDK's handshake agreed

    def __init__(self) -> None:
        super().__init__()
        self.shutdown_requested = False

    def handle(self, request: Any, session: str | None = None) -> Any:
        """One request object -> its reply (None for a notification). ``session`` is
        the HTTP session the request names (`HttpRcpServer`); over stdio the
        connection is the session and it is None."""
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
            return self._dispatch_request(request, session)
        except PROPAGATE:
            raise
        except BaseException as exc:  # the SDK promises "never raises"; hold it to that
            logger.warning("rcp: %s while handling a request", type(exc).__name__, exc_info=True)
            return _error(id_, rcp.Errc.INTERNAL_ERROR, f"internal error ({type(exc).__name__})")

    def _dispatch_request(self, request: Any, session: str | None) -> Any:
        return super().handle(request)

    def handle_line(self, line: str, session: str | None = None) -> str:
        """One frame (a request, a notification or a batch) -> the reply text ("" when
        nothing is to be answered), every request of it in ``session`` (see `handle`).
        Never raises."""
        try:
            return self._handle_line(line, session)
        except PROPAGATE:
            raise
        except BaseException as exc:  # pragma: no cover - last resort
            logger.warning("rcp: %s while handling a frame", type(exc).__name__, exc_info=True)
            return error_frame(rcp.Errc.INTERNAL_ERROR, f"internal error ({type(exc).__name__})")

    def _handle_line(self, line: str, session: str | None) -> str:
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
            replies = [r for r in (self.handle(m, session) for m in message) if r is not None]
            return dumps(replies) if replies else ""
        reply = self.handle(message, session)
        return dumps(reply) if reply is not None else ""


SESSION_HEADER = "RCP-Session"
"""The HTTP header a client sends its session token back in (§5.2)."""
Sessionless = Literal["stateless", "shared"]
"""How `HttpRcpServer` serves requests that name no session: ``stateless`` (each
``initialize`` judged on its own; after the first successful one the gated methods are
served to everyone) or ``shared`` (they are one session for the whole server: a second
successful ``initialize`` among them is -32600)."""
OPEN_METHODS = frozenset(
    {
        rcp.Method.INITIALIZE,
        rcp.Method.INFO,
        rcp.Method.PING,
        rcp.Method.SHUTDOWN,
        rcp.Method.CANCEL,
    }
)
"""The methods callable outside a session (§13); every other one is gated."""
_MAX_TOKEN_CHARS = 128


def session_key(token: str) -> bytes:
    """The key that signs session tokens, derived from the server's bearer token, so
    that replicas sharing a ``--token`` accept each other's sessions (the bearer
    token cannot be recovered from it, nor from the session tokens it signs)."""
    return hashlib.sha256(b"hyde-plus rcp session key\0" + token.encode("utf-8")).digest()


class SessionTokens:
    """Session tokens that need no table (§5.2): ``VERSION.NONCE.MAC``, the MAC an
    HMAC-SHA256 of the negotiated version and a random nonce under ``key``. Any server
    holding the key recognises a session any of them issued, however many, across
    restarts; nothing is stored per session.

    Args:
        key: the signing key; None: a random one, so only this object's tokens pass.
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def _mac(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode("ascii"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:18]).decode("ascii")

    def issue(self, version: int) -> str:
        """A new session token for a handshake that negotiated ``version``."""
        body = f"{version}.{secrets.token_urlsafe(16)}"
        return f"{body}.{self._mac(body)}"

    def version(self, token: str) -> int | None:
        """The version negotiated in the session ``token`` names; None when it is not a
        token this key signed (forged, altered, another server's, not ASCII)."""
        if len(token) > _MAX_TOKEN_CHARS or not token.isascii():
            return None
        body, _, mac = token.rpartition(".")
        version, _, nonce = body.partition(".")
        if not (version.isdigit() and nonce):
            return None
        if not hmac.compare_digest(mac, self._mac(body)):
            return None
        return int(version)


class HttpRcpServer(RcpServer):
    """`RcpServer` for connectionless HTTP, with the spec's sessions (§5.2, §13).

    A successful ``initialize`` issues a session token (`SessionTokens`) in
    ``result._meta.session``. A request naming a session this server's key signed is
    served in it: gated methods are served, a second ``initialize`` is -32600. One
    naming any other session gets -32001 for a gated method (``info`` and ``ping``
    still answer; an ``initialize`` opens a new session).

    Requests naming no session follow ``sessionless`` (`Sessionless`). ``stateless``:
    every ``initialize`` is judged on a throwaway copy of the session, so any client
    may handshake (again) and a bogus one (version 0, ``1e999``, a notification) only
    gets its own error; the first successful handshake unlocks the gated methods for
    good, the flag only ever going from locked to unlocked, so no client can lock the
    others out. ``shared``: they are one session, the SDK's (the reference server's
    HTTP model): the first successful ``initialize`` wins, any later one is -32600.

    Args:
        sessionless: the policy for requests that name no session.
        session_key: the key that signs session tokens (`session_key` derives one
            from a bearer token); None: a random one, sessions of this process only.
    """

    def __init__(
        self, *, sessionless: Sessionless = "stateless", session_key: bytes | None = None
    ) -> None:
        if sessionless not in get_args(Sessionless):
            raise ValueError(
                f"sessionless must be one of {', '.join(get_args(Sessionless))}, "
                f"not {sessionless!r}"
            )
        super().__init__()
        self.sessionless = sessionless
        self.tokens = SessionTokens(session_key)
        self._handshake = threading.Lock()

    def _dispatch_request(self, request: Any, session: str | None) -> Any:
        if not isinstance(request, dict):
            return super()._dispatch_request(request, session)
        method = request.get("method")
        if session is not None:
            version = self.tokens.version(session)
            if version is not None:
                return self._in_session(request, version)
            if method not in OPEN_METHODS:
                return _error(
                    request.get("id"),
                    rcp.Errc.NOT_INITIALIZED,
                    f"the session in {SESSION_HEADER} is not one this server issued (expired "
                    "or another server's): call 'initialize' without it for a new session",
                    {"header": SESSION_HEADER},
                )
        if method != rcp.Method.INITIALIZE:
            return super()._dispatch_request(request, session)
        if self.sessionless == "shared" and session is None:
            with self._handshake:  # one winner among concurrent handshakes
                reply = super()._dispatch_request(request, session)
                return self._with_session(reply, self._negotiated)
        probe = copy.copy(self)
        probe._initialized = False
        reply = rcp.Server.handle(probe, request)
        if probe._initialized:
            self._initialized = True
        return self._with_session(reply, probe._negotiated)

    def _in_session(self, request: dict[str, Any], version: int) -> Any:
        """``request`` served in an initialized session that negotiated ``version``."""
        if request.get("method") == rcp.Method.INITIALIZE:
            return _error(
                request.get("id"),
                rcp.Errc.INVALID_REQUEST,
                f"this session ({SESSION_HEADER}) is already initialized; re-negotiation "
                "is not permitted mid-session (call 'initialize' without it for a new "
                "session)",
            )
        probe = copy.copy(self)
        probe._initialized = True
        probe._negotiated = version
        return rcp.Server.handle(probe, request)

    def _with_session(self, reply: Any, version: int) -> Any:
        """A successful ``initialize`` reply with a new session in ``_meta.session``."""
        if not isinstance(reply, dict) or not isinstance(reply.get("result"), dict):
            return reply
        result = reply["result"]
        meta = result.get("_meta")
        result["_meta"] = {
            **(meta if isinstance(meta, dict) else {}),
            "session": self.tokens.issue(version),
        }
        return reply


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
