"""What an ``--llm`` value names, read without importing LlamaIndex (the CLI checks it
before anything heavy loads; `models.resolve_llm` reads it the same way).

- ``auto``, ``local``, ``openai[:MODEL]``: as before (``auto`` is OpenAI when
  ``OPENAI_API_KEY`` is set, else the bundled local model);
- ``PATH.gguf``: any GGUF file, run in-process by the bundled llama.cpp;
- ``http://HOST:PORT/v1`` (or ``https://``): any OpenAI-compatible server (vLLM,
  llama.cpp's server, LM Studio, Ollama's ``/v1``). The model is
  ``$HYDE_PLUS_LLM_MODEL``, else the server's first model (``GET /v1/models``); the key
  is ``$HYDE_PLUS_LLM_API_KEY``, else none (a local server needs none). The OpenAI key
  is never sent to such a server. The CLI's ``--llm-model`` and ``--llm-key`` say the
  same and win over the environment;
- ``ollama[:MODEL]``: a model of a local Ollama, through its OpenAI-compatible endpoint
  (``http://localhost:11434/v1``, or the host in ``$OLLAMA_HOST``), as any server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

LLM_MODEL_ENV = "HYDE_PLUS_LLM_MODEL"
"""The model an OpenAI-compatible server (``--llm http://...``) is asked for."""
LLM_KEY_ENV = "HYDE_PLUS_LLM_API_KEY"
"""The key sent to an OpenAI-compatible server (``--llm http://...``); none when unset."""
LLM_CHOICES = "auto, local, openai[:MODEL], PATH.gguf, http://HOST:PORT/v1 or ollama[:MODEL]"
"""What ``--llm`` takes, in words."""


@dataclass(frozen=True)
class LlmSpec:
    """An ``--llm`` value read: ``kind`` is ``local``, ``openai``, ``gguf`` or
    ``server``; ``value`` the OpenAI model, the GGUF path or the server's base URL;
    ``model`` the server's model the value itself names (``ollama:MODEL``)."""

    kind: str
    value: str | None = None
    model: str | None = None


OLLAMA_PORT = 11434
"""The port Ollama listens on unless ``OLLAMA_HOST`` says otherwise."""


def ollama_base_url() -> str:
    """Ollama's OpenAI-compatible endpoint: ``http://localhost:11434/v1``, or the host
    (``HOST``, ``HOST:PORT`` or ``http[s]://HOST[:PORT]``) in ``OLLAMA_HOST``, as Ollama's
    own client reads it: without a scheme the port is 11434, with one 80 or 443; a
    server bound to ``0.0.0.0`` is reached on localhost."""
    host = os.environ.get("OLLAMA_HOST", "").strip().rstrip("/")
    if not host:
        return f"http://localhost:{OLLAMA_PORT}/v1"
    schemed = "://" in host
    parts = urlsplit(host if schemed else f"http://{host}")
    wrong = ValueError(
        f"OLLAMA_HOST={host!r} is not a host: give HOST, HOST:PORT or http://HOST:PORT"
    )
    try:
        port = parts.port
    except ValueError:
        raise wrong from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise wrong
    name = "localhost" if parts.hostname in ("0.0.0.0", "::") else parts.hostname
    name = f"[{name}]" if ":" in name else name
    if port is None:
        port = (443 if parts.scheme == "https" else 80) if schemed else OLLAMA_PORT
    return f"{parts.scheme}://{name}:{port}/v1"


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
    if kind == "ollama":
        return LlmSpec("server", ollama_base_url(), model=model.strip() or None)
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


def check_server_options(spec: str, model: str | None, key: str | None) -> ServerChoice | None:
    """A server's model and key (``--llm-model``/``--llm-key`` over `LLM_MODEL_ENV`/
    `LLM_KEY_ENV`) when ``spec`` names a server, else None; a `ValueError` naming the
    option when one is given for any other model, is empty or holds a control
    character (the key itself is never shown)."""
    head = spec.strip().lower().partition(":")[0]
    named = None if head in ("scripted", "oracle") else read_llm_spec(spec)
    if named is None or named.kind != "server":
        given = [o for o, v in (("--llm-model", model), ("--llm-key", key)) if v is not None]
        if given:
            raise ValueError(
                f"{' and '.join(given)}: only for a server (--llm http://HOST:PORT/v1 or "
                f"ollama[:MODEL]), not for --llm {spec.strip()[:40]!r}"
            )
        return None
    for option, value in (("--llm-model", model), ("--llm-key", key)):
        if value is not None and (not value.strip() or not value.isprintable()):
            raise ValueError(f"{option} must be printable text, not empty")
    if key is not None and not key.isascii():
        raise ValueError("--llm-key must be ASCII text (it is sent in an HTTP header)")
    if named.model and model is not None and model.strip() != named.model:
        raise ValueError(f"--llm {spec.strip()!r} names the model already; drop --llm-model")
    env_model = os.environ.get(LLM_MODEL_ENV, "").strip() or None
    env_key = os.environ.get(LLM_KEY_ENV, "").strip() or None
    return ServerChoice(
        model=named.model or (model.strip() if model is not None else env_model),
        key=key.strip() if key is not None else env_key,
    )


@dataclass(frozen=True)
class ServerChoice:
    """An OpenAI-compatible server's model (None: its first) and key (None: none)."""

    model: str | None
    key: str | None = field(repr=False)
