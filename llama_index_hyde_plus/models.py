"""The one resolver of model names (CLI, pipeline, evaluation, server): ``auto``,
``local``, ``openai[:MODEL]`` and, for LLMs, ``PATH.gguf``, ``http://HOST:PORT/v1``
(an OpenAI-compatible server) and ``scripted[:DELAY_MS]`` (see `_model_spec`).

``auto`` means OpenAI when ``OPENAI_API_KEY`` is set, else the local models.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM

from ._extras import install_hint
from ._keys import require_openai_key
from ._model_spec import LLM_MODEL_ENV, check_server_options, read_llm_spec
from ._redact import redact_uri

DEFAULT_OPENAI_LLM = "gpt-4o-mini"
"""The model ``openai`` (without ``:MODEL``) means for an LLM."""
DEFAULT_OPENAI_EMBED = "text-embedding-3-small"
"""The model ``openai`` (without ``:MODEL``) means for embeddings."""


class MissingExtraError(ImportError):
    """An optional dependency group (``local``, ``eval``, ``milvus``) is not installed."""


def require_extra(extra: str, modules: Sequence[str], what: str) -> None:
    """Raise `MissingExtraError` naming the extra to install if a module is missing."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise MissingExtraError(
                f"{what} needs the '{extra}' extra ({module} is not installed): "
                f"{install_hint(extra)}"
            ) from exc


OPENAI_EMBED_RETRIES = 2
"""Retries of an OpenAI embedding request: enough for a rate limit, not 10 rounds of
4-10 s waits when the network or the endpoint is down."""


def _split(spec: str) -> tuple[str, str | None]:
    """An embedding model's ``spec``: ``auto``, ``local`` or ``openai[:MODEL]``."""
    if _is_llm_only(spec):
        raise ValueError(f"unknown model choice {spec!r}: use auto, local or openai[:MODEL]")
    choice = read_llm_spec(spec)
    return choice.kind, choice.value


def _is_llm_only(spec: str) -> bool:
    """A GGUF path or a server address: an LLM, never an embedding model."""
    text = spec.strip().lower()
    return text.endswith(".gguf") or text.startswith(("http://", "https://"))


def llm_threads() -> int | None:
    """``HYDE_PLUS_LLM_THREADS``: llama.cpp threads for the local LLM (None: its own
    choice). On a busy machine one thread can be several times faster than two."""
    threads = os.environ.get("HYDE_PLUS_LLM_THREADS", "").strip()
    if not threads:
        return None
    if not (threads.isdigit() and int(threads) >= 1):
        raise ValueError(f"HYDE_PLUS_LLM_THREADS must be a whole number >= 1, not {threads!r}")
    return int(threads)


def resolve_llm(
    spec: str = "auto",
    *,
    temperature: float | None = None,
    max_tokens: int | None = None,
    seed: int | None = None,
    parallel: int | None = None,
    server_model: str | None = None,
    server_key: str | None = None,
) -> LLM:
    """The LLM named by ``spec`` (`_model_spec`), or ``scripted[:DELAY_MS]``
    (`echo.EchoLLM`, for load tests and demos of the plumbing). ``server_model`` and
    ``server_key`` (``--llm-model``, ``--llm-key``) name a server's model and key, over
    the environment (`_model_spec.check_server_options`).

    ``temperature`` and ``max_tokens`` are the model's defaults; ``seed`` (sampling)
    and ``parallel`` (requests decoded together, capped at 8) apply to the local LLM,
    whose llama.cpp threads come from ``HYDE_PLUS_LLM_THREADS``. ``None`` keeps each
    model's own default."""
    head = spec.strip().lower()
    server = check_server_options(spec, server_model, server_key)
    if head == "scripted" or head.startswith("scripted:"):
        return _scripted(spec)
    if parallel is not None and parallel < 1:
        raise ValueError(f"parallel must be >= 1, not {parallel}")
    choice = read_llm_spec(spec)
    if choice.kind == "openai":
        from llama_index.llms.openai import OpenAI

        require_openai_key("--llm")
        kwargs = _given(temperature=temperature, max_tokens=max_tokens)
        # no retries inside the client: our one retry driver (`_llm`, the transforms'
        # `RetryPolicy`) retries transient errors; the client's own retries stacked on
        # LlamaIndex's (12 requests for one call) hid an HTTP 500 behind the timeout
        return OpenAI(model=choice.value or DEFAULT_OPENAI_LLM, max_retries=0, **kwargs)
    if choice.kind == "server":
        assert choice.value is not None and server is not None
        return _server_llm(
            choice.value,
            model=server.model,
            key=server.key,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
        )
    require_extra("local", ("xllamacpp",), "the local LLM")
    from .local import local_llm

    n_parallel = None if parallel is None else max(1, min(parallel, 8))
    return local_llm(
        path=choice.value if choice.kind == "gguf" else None,
        **_given(
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
            n_parallel=n_parallel,
            threads=llm_threads(),
        ),
    )


SERVER_MAX_TOKENS = 256
"""Tokens a server's reply may take when nobody said (as `LocalLLM`'s default): a
server left to its own cap (llama.cpp's: the whole context) can write for minutes."""
SERVER_LIST_TIMEOUT_S = 10.0
"""Seconds to wait for an OpenAI-compatible server's list of models."""


def server_models(base_url: str, api_key: str | None = None) -> list[str]:
    """The model ids an OpenAI-compatible server at ``base_url`` lists
    (``GET {base_url}/models``); a `ValueError` naming ``--llm`` when it cannot be read."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reply = httpx.get(f"{base_url}/models", headers=headers, timeout=SERVER_LIST_TIMEOUT_S)
        reply.raise_for_status()
        entries = reply.json().get("data") or []
        return [str(e["id"]) for e in entries if isinstance(e, dict) and e.get("id")]
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise ValueError(
            f"--llm {redact_uri(base_url)}: could not list the server's models "
            f"({type(exc).__name__}: {exc}); is it running? Name the model with --llm-model "
            f"or {LLM_MODEL_ENV}"
        ) from None


def _server_llm(
    base_url: str,
    *,
    model: str | None,
    key: str | None,
    temperature: float | None,
    max_tokens: int | None,
    seed: int | None,
) -> LLM:
    """An OpenAI-compatible server's ``model`` through LlamaIndex's ``OpenAILike``, else
    the server's first; ``key``, else a placeholder (the client requires one; a local
    server reads none). The OpenAI key is never sent: the server may be anyone's."""
    require_extra("cli", ("llama_index.llms.openai_like",), "an OpenAI-compatible server")
    from llama_index.llms.openai_like import OpenAILike

    if not model:
        listed = server_models(base_url, key)
        if not listed:
            raise ValueError(
                f"--llm {redact_uri(base_url)}: the server lists no model; name one with "
                f"--llm-model or {LLM_MODEL_ENV}"
            )
        model = listed[0]
    return OpenAILike(
        model=model,
        api_base=base_url,
        api_key=key or "no-key",
        is_chat_model=True,
        max_retries=0,  # as for OpenAI: our retry driver retries
        additional_kwargs=_given(seed=seed),
        max_tokens=max_tokens or SERVER_MAX_TOKENS,
        **_given(temperature=temperature),
    )


def _given(**kwargs: Any) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if v is not None}


def _scripted(spec: str) -> LLM:
    from .echo import EchoLLM

    _, _, delay = spec.partition(":")
    try:
        ms = float(delay or 0)
    except ValueError:
        raise ValueError(f"scripted delay must be milliseconds, not {delay!r}") from None
    if not 0 <= ms <= 3_600_000:
        raise ValueError(f"scripted delay must be 0 to 3600000 milliseconds, not {delay!r}")
    return EchoLLM(delay=ms / 1000)


def describe_llm(model: Any) -> str:
    """The model id an LLM reports, else its class name: for banners and reports."""
    from .calls.llm import model_name

    return model_name(model) or type(model).__name__


def resolve_embedding(spec: str = "auto", *, max_length: int = 256) -> BaseEmbedding:
    """The embedding model named by ``spec``."""
    kind, model = _split(spec)
    if kind == "openai":
        from llama_index.embeddings.openai import OpenAIEmbedding

        require_openai_key("--embed")
        return OpenAIEmbedding(
            model=model or DEFAULT_OPENAI_EMBED, max_retries=OPENAI_EMBED_RETRIES, timeout=30.0
        )
    require_extra("local", ("fastembed",), "the local embedding model")
    from .local import local_embedding

    return local_embedding(max_length=max_length)


def concrete_embedding_spec(spec: str) -> str:
    """``spec`` without ``auto``, to store beside an index so queries embed alike."""
    kind, model = _split(spec)
    return f"openai:{model or DEFAULT_OPENAI_EMBED}" if kind == "openai" else "local"
