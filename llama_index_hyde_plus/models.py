"""Model choices by name, for the CLI: ``auto``, ``local``, ``openai[:MODEL]``.

``auto`` means OpenAI when ``OPENAI_API_KEY`` is set, else the local models.
"""

from __future__ import annotations

import os
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM

DEFAULT_OPENAI_LLM = "gpt-4o-mini"
DEFAULT_OPENAI_EMBED = "text-embedding-3-small"


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

        kwargs: dict[str, Any] = {} if temperature is None else {"temperature": temperature}
        return OpenAI(model=model or DEFAULT_OPENAI_LLM, **kwargs)
    from .local import local_llm

    return local_llm() if temperature is None else local_llm(temperature=temperature)


def resolve_embedding(spec: str = "auto", *, max_length: int = 256) -> BaseEmbedding:
    """The embedding model named by ``spec``."""
    kind, model = _split(spec)
    if kind == "openai":
        from llama_index.embeddings.openai import OpenAIEmbedding

        return OpenAIEmbedding(model=model or DEFAULT_OPENAI_EMBED)
    from .local import local_embedding

    return local_embedding(max_length=max_length)


def concrete_embedding_spec(spec: str) -> str:
    """``spec`` without ``auto``, to store beside an index so queries embed alike."""
    kind, model = _split(spec)
    return f"openai:{model or DEFAULT_OPENAI_EMBED}" if kind == "openai" else "local"
