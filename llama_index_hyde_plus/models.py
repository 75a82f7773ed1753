"""Model choices by name, for the CLI: ``auto``, ``local``, ``openai[:MODEL]``.

``auto`` means OpenAI when ``OPENAI_API_KEY`` is set, else the local models.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM

DEFAULT_OPENAI_LLM = "gpt-4o-mini"
DEFAULT_OPENAI_EMBED = "text-embedding-3-small"


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


def _require_openai_key(flag: str) -> None:
    if not os.environ.get("OPENAI_API_KEY", "").strip():
        raise ValueError(f"{flag} openai needs an API key: set OPENAI_API_KEY, or use {flag} local")


#: Retries of an OpenAI embedding request: enough for a rate limit, not 10 rounds of
#: 4-10 s waits when the network or the endpoint is down.
OPENAI_EMBED_RETRIES = 2


def _split(spec: str) -> tuple[str, str | None]:
    kind, _, model = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "auto":
        kind = "openai" if os.environ.get("OPENAI_API_KEY") else "local"
    if kind not in ("local", "openai"):
        raise ValueError(f"unknown model choice {spec!r}: use auto, local or openai[:MODEL]")
    return kind, model or None


def resolve_llm(spec: str = "auto", *, temperature: float | None = None) -> LLM:
    """The LLM named by ``spec``; ``scripted[:DELAY_MS]`` is the echoing test double
    (`testing.echo_llm`), for load tests and demos of the plumbing."""
    if spec.startswith("scripted"):
        from .testing import echo_llm

        _, _, delay = spec.partition(":")
        try:
            return echo_llm(delay=float(delay or 0) / 1000)
        except ValueError as exc:
            raise ValueError(f"scripted delay must be milliseconds, not {delay!r}") from exc
    kind, model = _split(spec)
    if kind == "openai":
        from llama_index.llms.openai import OpenAI

        _require_openai_key("--llm")
        kwargs: dict[str, Any] = {} if temperature is None else {"temperature": temperature}
        return OpenAI(model=model or DEFAULT_OPENAI_LLM, **kwargs)
    require_extra("local", ("xllamacpp",), "the local LLM")
    from .local import local_llm

    return local_llm() if temperature is None else local_llm(temperature=temperature)


def resolve_embedding(spec: str = "auto", *, max_length: int = 256) -> BaseEmbedding:
    """The embedding model named by ``spec``."""
    kind, model = _split(spec)
    if kind == "openai":
        from llama_index.embeddings.openai import OpenAIEmbedding

        _require_openai_key("--embed")
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
