"""What an ``--llm`` value names, read without importing LlamaIndex (the CLI checks it
before anything heavy loads; `models.resolve_llm` reads it the same way).

- ``auto``, ``local``, ``openai[:MODEL]``: as before (``auto`` is OpenAI when
  ``OPENAI_API_KEY`` is set, else the bundled local model);
- ``PATH.gguf``: any GGUF file, run in-process by the bundled llama.cpp;
- ``http://HOST:PORT/v1`` (or ``https://``): any OpenAI-compatible server (vLLM,
  llama.cpp's server, LM Studio, Ollama's ``/v1``). The model is
  ``$HYDE_PLUS_LLM_MODEL``, else the server's first model (``GET /v1/models``); the key
  is ``$HYDE_PLUS_LLM_API_KEY``, else none (a local server needs none). The OpenAI key
  is never sent to such a server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

LLM_MODEL_ENV = "HYDE_PLUS_LLM_MODEL"
"""The model an OpenAI-compatible server (``--llm http://...``) is asked for."""
LLM_KEY_ENV = "HYDE_PLUS_LLM_API_KEY"
"""The key sent to an OpenAI-compatible server (``--llm http://...``); none when unset."""
LLM_CHOICES = "auto, local, openai[:MODEL], PATH.gguf or http://HOST:PORT/v1"
"""What ``--llm`` takes, in words."""


@dataclass(frozen=True)
class LlmSpec:
    """An ``--llm`` value read: ``kind`` is ``local``, ``openai``, ``gguf`` or
    ``server``; ``value`` the OpenAI model, the GGUF path or the server's base URL."""

    kind: str
    value: str | None = None


def _server(spec: str) -> LlmSpec:
    parts = urlsplit(spec)
    if not parts.hostname or parts.query or parts.fragment:
        raise ValueError(
            f"--llm {parts.scheme}://...: not a server address; give its base URL, "
            "e.g. http://127.0.0.1:8080/v1"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError(f"--llm: the port of {parts.hostname} is not a number") from None
    return LlmSpec("server", spec.rstrip("/"))


def _gguf(spec: str) -> LlmSpec:
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(f"--llm: GGUF file not found: {path}")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"--llm: {path} is not a GGUF model file")
    return LlmSpec("gguf", str(path.absolute()))


def read_llm_spec(spec: str) -> LlmSpec:
    """What ``spec`` names; a `ValueError` naming ``--llm`` when it names nothing (an
    unknown word, a GGUF file that is missing or is not one, an address without a host)."""
    text = spec.strip()
    lower = text.lower()
    if lower.startswith(("http://", "https://")):
        return _server(text)
    if lower.endswith(".gguf"):
        return _gguf(text)
    kind, _, model = text.partition(":")
    kind = kind.lower()
    if kind == "auto":
        kind = "openai" if os.environ.get("OPENAI_API_KEY") else "local"
    if kind not in ("local", "openai"):
        raise ValueError(f"unknown model choice {spec!r}: use {LLM_CHOICES}")
    if kind == "local" and model:
        raise ValueError(
            f"{spec!r}: 'local' takes no model name; give your own model as "
            "--llm PATH.gguf (or an embedding folder in HYDE_PLUS_EMBED_DIR)"
        )
    return LlmSpec(kind, model or None)
