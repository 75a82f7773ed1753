"""``hyde-plus serve``: the Retrieval Context Protocol over stdio or HTTP."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import _console as ui
from . import _early as early
from ._console import fail, reported, setup_logging, warm_up
from ._names import TIMEOUT_POLICY
from ._options import (
    LLM_HELP,
    Collection,
    IndexPath,
    LlmFlags,
    LlmKey,
    LlmModel,
    MilvusToken,
    Uri,
    Verbose,
)

#: The ``server`` extra: what `rcp` and `rcp_http` are written with.
SERVER_EXTRA: tuple[str, tuple[str, ...]] = ("server", ("rcp", "starlette", "uvicorn"))

ServeLlm = Annotated[
    str, typer.Option(help=LLM_HELP[:-1] + ", or scripted[:DELAY_MS] (load tests).")
]

if TYPE_CHECKING:
    import socket

    from ..server.rcp import Sessionless
    from ..stores import Store


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


_CACHE_SCHEMES = ("redis://", "rediss://", "unix://")
CacheSpec = Annotated[
    str,
    typer.Option(
        "--cache",
        help="Transform cache: memory (this process), a Redis URL (redis://host:port/0, "
        "shared by every replica, kept across restarts) or a SQLite file.",
    ),
]


def _check_flags(
    stdio: bool,
    http: int | None,
    token: str | None,
    timeout: float | None,
    max_inflight: int,
    cache: str = "memory",
) -> None:
    if cache != "memory" and "://" in cache and not cache.startswith(_CACHE_SCHEMES):
        raise fail(
            f"--cache must be memory, a Redis URL (redis://host:port/db, rediss://, "
            f"unix://) or a SQLite file path, not {cache!r}"
        )
    if stdio == (http is not None):
        raise fail("choose exactly one of --stdio and --http PORT")
    if token == "" or (token is None and os.environ.get("HYDE_PLUS_TOKEN") == ""):
        raise fail(
            "the token is empty (--token or HYDE_PLUS_TOKEN): give a secret, or leave both "
            "unset to serve without authentication on 127.0.0.1"
        )
    secret = token if token is not None else os.environ.get("HYDE_PLUS_TOKEN")
    if secret:
        from ..server.http import check_token

        try:
            check_token(secret)
        except ValueError as exc:
            raise fail(f"--token (or HYDE_PLUS_TOKEN): {exc}") from None
    if timeout is not None and not timeout > 0:
        raise fail(f"--timeout must be > 0 seconds, not {timeout:g}")
    if max_inflight < 1:
        raise fail(f"--max-inflight must be >= 1, not {max_inflight}")


def check_writable(writable: bool, http: int | None, token: str | None, has_index: bool) -> None:
    """Refuse ``--writable`` without an index to write, or over HTTP without a token:
    ``index/add`` and ``index/delete`` change the index, so over HTTP only a caller
    holding the token may call them (over stdio the caller is whoever started us)."""
    if not writable:
        return
    if not has_index:
        raise fail("--writable needs an index to write: give --uri (a Milvus index)")
    if http is not None and not token:
        raise fail(
            "--writable over HTTP needs --token (or HYDE_PLUS_TOKEN): index/add and "
            "index/delete change the index, so only a caller with the token may call them"
        )


SessionlessOption = Annotated[
    str | None,
    typer.Option(
        "--sessionless",
        metavar="stateless|shared",
        help="HTTP requests without an RCP-Session header: stateless (default: any "
        "client may initialize) or shared (one session for the whole server, as the "
        "protocol's conformance harness expects: a second initialize is -32600).",
    ),
]


def check_sessionless(sessionless: str | None, http: int | None) -> Sessionless:
    """The ``--sessionless`` policy (default ``stateless``): HTTP only, and one of
    `rcp.Sessionless`."""
    from typing import cast

    from ._names import SESSIONLESS as choices

    if sessionless is None:
        return "stateless"
    if http is None:
        raise fail("--sessionless applies to --http only (over stdio the pipe is the session)")
    if sessionless not in choices:
        raise fail(f"--sessionless must be {' or '.join(choices)}, not {sessionless!r}")
    return cast("Sessionless", sessionless)


def _bind(host: str, port: int, token: str | None) -> socket.socket:
    """The listening socket, bound before anything loads (a busy port fails fast)."""
    from rich.panel import Panel

    from ..server.http import ServeError, bind_socket

    if not is_loopback(host) and token is None:
        ui.err.print(
            Panel(
                f"Serving on [bold]{host}[/] WITHOUT a token: anyone who can reach this "
                "address can call the server and spend your LLM budget. Set --token "
                "(or HYDE_PLUS_TOKEN), or bind 127.0.0.1.",
                title="[bold red]WARNING: no authentication[/]",
                border_style="red",
            )
        )
    try:
        return bind_socket(host, port)
    except ServeError as exc:
        raise fail(str(exc)) from exc


def _tuned_options(config_files: list[Path] | None) -> dict[str, dict[str, Any]]:
    """Options by method from `hyde-plus tune` configs (one per method)."""
    from ..transforms.config import load_config
    from ..transforms.registry import METHODS

    tuned: dict[str, dict[str, Any]] = {}
    for path in config_files or []:
        config = load_config(path)
        if config.transform not in METHODS:
            raise ValueError(
                f"{path}: serve --config takes configs of {', '.join(METHODS)}, "
                f"not {config.transform}"
            )
        if config.transform in tuned:
            raise ValueError("serve --config takes at most one config per method")
        tuned[config.transform] = dict(config.options)
    return tuned


def _cache(spec: str) -> Any:
    """The transform cache ``--cache`` names: None for ``memory`` (the service's own
    per-process cache), a `KVStoreCache` for a Redis URL, a `SQLiteCache` for a path."""
    if spec == "memory":
        return None
    if spec.startswith(_CACHE_SCHEMES):
        from ..caching.kv_cache import KVStoreCache

        return KVStoreCache.from_uri(spec)
    from ..caching.cache import SQLiteCache

    return SQLiteCache(spec)


def _service(
    store: Store | None,
    llm: LlmFlags,
    timeout: float | None,
    config_files: list[Path] | None,
    *,
    cache: str = "memory",
    embed: str | None = None,
    writable: bool = False,
) -> Any:
    """The service: with a ``store``, its index searched in each of its modes and
    reranked with its embedding model (``embed`` overrides it), and written to when
    ``writable``; without one, transforms only, plus ``rerank`` when ``embed`` names
    an embedding model."""
    from ..models import resolve_embedding
    from ..server.rcp import MAX_K, TransformService

    with reported():
        options = _tuned_options(config_files)
        if store is None:
            return TransformService(
                llm.resolve(),
                cache=_cache(cache),
                timeout=timeout,
                options=options,
                modes=(),
                embed_model=resolve_embedding(embed) if embed else None,
            )
        embed_model = store.embedding_model(embed)
        index = store.load(embed_model)
        writer = store.writer(index, embed_model) if writable else None
        return TransformService(
            llm.resolve(),
            store.retriever(index, MAX_K),
            cache=_cache(cache),
            timeout=timeout,
            options=options,
            modes=store.modes,
            mode_retrievers={m: store.mode_retriever(index, MAX_K, m) for m in store.modes[1:]},
            embed_model=embed_model,
            writer=writer,
        )


RerankEmbed = Annotated[
    str | None,
    typer.Option(
        help="Embedding model for rerank (auto, local, openai[:MODEL]); default: the "
        "index's own, none without an index (no rerank).",
    ),
]
Writable = Annotated[
    bool,
    typer.Option(
        "--writable",
        help="Offer index/add and index/delete on a Milvus --uri (over HTTP only with --token).",
    ),
]


def _store(
    index_path: Path | None, uri: str | None, collection: str, milvus_token: str | None
) -> Store | None:
    """The store at --index or --uri; None for neither (transform only)."""
    if index_path is None and uri is None:
        return None
    from ..stores import open_store

    with reported():
        return open_store(
            index=index_path, uri=uri, collection=collection, token=milvus_token or ""
        )


StdioFlag = Annotated[bool, typer.Option("--stdio", help="Serve one client on stdin/stdout.")]
HttpPort = Annotated[
    int | None, typer.Option("--http", help="Serve HTTP on this port (0: a free one).")
]


def serve(
    index_path: IndexPath = None,
    uri: Uri = None,
    collection: Collection = "hyde_plus",
    milvus_token: MilvusToken = None,
    stdio: StdioFlag = False,
    http: HttpPort = None,
    host: Annotated[str, typer.Option(help="HTTP bind address (IPv4 or IPv6).")] = "127.0.0.1",
    token: Annotated[
        str | None,
        typer.Option(
            help="Require 'Authorization: Bearer TOKEN' (HTTP).", envvar="HYDE_PLUS_TOKEN"
        ),
    ] = None,
    llm: ServeLlm = "auto",
    llm_model: LlmModel = None,
    llm_key: LlmKey = None,
    timeout: Annotated[
        float | None,
        typer.Option(help=f"Seconds per LLM call before falling back (default: {TIMEOUT_POLICY})."),
    ] = None,
    max_inflight: Annotated[
        int, typer.Option(help="HTTP requests served at once; more get 503 / -32010.")
    ] = 64,
    config_files: Annotated[
        list[Path] | None,
        typer.Option(
            "--config",
            metavar="<path>",
            help="Options for a method from `hyde-plus tune` (repeatable).",
        ),
    ] = None,
    cache: CacheSpec = "memory",
    embed: RerankEmbed = None,
    writable: Writable = False,
    sessionless: SessionlessOption = None,
    verbose: Verbose = False,
) -> None:
    """Serve the Retrieval Context Protocol: query/transform, and retrieve and rerank
    over a FAISS --index or a Milvus --uri (omit both: transform only, plus rerank with
    --embed). --writable lets clients add and delete documents in a Milvus index."""
    setup_logging(verbose)
    _check_flags(stdio, http, token, timeout, max_inflight, cache)
    check_writable(writable, http, token, index_path is not None or uri is not None)
    policy = check_sessionless(sessionless, http)
    with early.refused():
        early.extra(*SERVER_EXTRA, "hyde-plus serve")
        early.llm_choice(llm, flags=(llm_flags := LlmFlags(llm, llm_model, llm_key)))
        if index_path is not None or uri is not None:
            early.store_address(index_path, uri)
        for path in config_files or []:
            early.config_file(path)
    sock = _bind(host, http, token) if http is not None else None
    store = _store(index_path, uri, collection, milvus_token)
    service = _service(
        store, llm_flags, timeout, config_files, cache=cache, embed=embed, writable=writable
    )
    warm_up(service.llm)
    _run(service, store, llm, sock, token, max_inflight, policy)


def _describe_cache(cache: Any) -> str:
    """``memory``, ``sqlite PATH`` or ``redis HOST:PORT/DB`` for the banner (no secret)."""
    from ..caching.cache import SQLiteCache
    from ..caching.kv_cache import KVStoreCache

    if isinstance(cache, SQLiteCache):
        return f"sqlite {cache.path}"
    if isinstance(cache, KVStoreCache):
        return cache.describe()
    return "memory"


def _run(
    service: Any,
    store: Store | None,
    llm: str,
    sock: socket.socket | None,
    token: str | None,
    max_inflight: int,
    sessionless: Sessionless = "stateless",
) -> None:
    from .._redact import redact_uri
    from ..calls.timeouts import describe_timeout
    from ..models import describe_llm
    from ..server.http import Limits, RcpHttpServer
    from ..server.rcp import build_server, serve_stdio, session_key

    name = describe_llm(service.llm)
    what = (
        f"index: {store.describe() if store else 'none'}"
        f"{' (writable)' if service.writer is not None else ''}, "
        f"llm: {name if name == llm else f'{name} ({redact_uri(llm)})'}, "
        f"timeout: {describe_timeout(service.llm, service.timeout)}, "
        f"cache: {_describe_cache(service.cache)}"
    )
    if sock is None:
        ui.err.print(f"RCP server on stdio ({what})")
        try:
            serve_stdio(build_server(service))
        except KeyboardInterrupt:
            pass
        return
    rcp_server = build_server(
        service,
        http=True,
        sessionless=sessionless,
        session_key=session_key(token) if token else None,
    )
    server = RcpHttpServer(
        rcp_server,
        sock=sock,
        token=token,
        limits=Limits(max_inflight=max_inflight),
    )
    ui.err.print(
        f"RCP server on {server.url} ({what}{', token required' if token else ''}"
        f"{', sessionless requests: one shared session' if sessionless == 'shared' else ''}"
        "); Ctrl-C to stop"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    ui.err.print("stopped")
