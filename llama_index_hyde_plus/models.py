"""The one resolver of model names (CLI, pipeline, evaluation, server): ``auto``,
``local``, ``openai[:MODEL]`` and, for LLMs, ``scripted[:DELAY_MS]``.

``auto`` means OpenAI when ``OPENAI_API_KEY`` is set, else the local models.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM

from ._keys import require_openai_key

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
                f'pip install "llama-index-hyde-plus[{extra}]"'
            ) from exc


OPENAI_EMBED_RETRIES = 2
"""Retries of an OpenAI embedding request: enough for a rate limit, not 10 rounds of
4-10 s waits when the network or the endpoint is down."""


def _split(spec: str) -> tuple[str, str | None]:
    kind, _, model = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "auto":
        kind = "openai" if os.environ.get("OPENAI_API_KEY") else "local"
    if kind not in ("local", "openai"):
        raise ValueError(f"unknown model choice {spec!r}: use auto, local or openai[:MODEL]")
    if kind == "local" and model:
        raise ValueError(
            f"{spec!r}: 'local' takes no model name (set HYDE_PLUS_LLM_GGUF or "
            "HYDE_PLUS_EMBED_DIR to use your own local model files)"
        )
    return kind, model or None


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
) -> LLM:
    """The LLM named by ``spec``: ``auto``, ``local``, ``openai[:MODEL]``, or
    ``scripted[:DELAY_MS]`` (`echo.EchoLLM`, for load tests and demos of the plumbing).

    ``temperature`` and ``max_tokens`` are the model's defaults; ``seed`` (sampling)
    and ``parallel`` (requests decoded together, capped at 8) apply to the local LLM,
    whose llama.cpp threads come from ``HYDE_PLUS_LLM_THREADS``. ``None`` keeps each
    model's own default."""
    head = spec.strip().lower()
    if head == "scripted" or head.startswith("scripted:"):
        return _scripted(spec)
    if parallel is not None and parallel < 1:
        raise ValueError(f"parallel must be >= 1, not {parallel}")
    kind, model = _split(spec)
    if kind == "openai":
        from llama_index.llms.openai import OpenAI

        require_openai_key("--llm")
        kwargs = _given(temperature=temperature, max_tokens=max_tokens)
        # no retries inside the client: our one retry driver (`_llm`, the transforms'
        # `RetryPolicy`) retries transient errors; the client's own retries stacked on
        # LlamaIndex's (12 requests for one call) hid an HTTP 500 behind the timeout
        return OpenAI(model=model or DEFAULT_OPENAI_LLM, max_retries=0, **kwargs)
    require_extra("local", ("xllamacpp",), "the local LLM")
    from .local import local_llm

    n_parallel = None if parallel is None else max(1, min(parallel, 8))
    return local_llm(
        **_given(
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
            n_parallel=n_parallel,
            threads=llm_threads(),
        )
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
    from ._llm import model_name

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
