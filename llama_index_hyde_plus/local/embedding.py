"""`LocalEmbedding`: all-MiniLM-L6-v2 (int8 ONNX) on the CPU through fastembed.

fastembed runs the ONNX file with onnxruntime (no PyTorch) and does the mean pooling
and normalisation of sentence-transformers. The sequence length is capped at
``max_length`` tokens (256, the model's own limit, by default): fastembed's default of
512 costs 3x the time for no gain on this model.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import Field, PrivateAttr

FASTEMBED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_SPECIAL = {
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "unk_token": "[UNK]",
    "mask_token": "[MASK]",
}


def assemble_model_dir(onnx: Path, tokenizer: Path, root: Path, max_length: int) -> Path:
    """A fastembed-loadable folder: the ONNX file (linked), ``tokenizer.json`` and the
    small config files fastembed reads, with truncation at ``max_length``."""
    if not 8 <= max_length <= 512:
        raise ValueError("max_length must be between 8 and 512")
    folder = root / f"all-MiniLM-L6-v2-int8-L{max_length}"
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.onnx"
    if not model.exists():
        try:
            os.link(onnx, model)
        except OSError:
            shutil.copyfile(onnx, model)
    files = {
        "tokenizer_config.json": {
            "model_max_length": max_length,
            "do_lower_case": True,
            "tokenizer_class": "BertTokenizer",
            **_SPECIAL,
        },
        "special_tokens_map.json": _SPECIAL,
        "config.json": {"model_type": "bert", "hidden_size": 384, "pad_token_id": 0},
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))
    shutil.copyfile(tokenizer, folder / "tokenizer.json")
    return folder


class LocalEmbedding(BaseEmbedding):
    """A fastembed ONNX sentence embedding model as a LlamaIndex embedding.

    ``model_dir`` holds ``model.onnx``, ``tokenizer.json`` and fastembed's config
    files; ``fastembed_model`` names the registered architecture (pooling,
    dimension). ``threads`` bounds onnxruntime's threads; ``batch_size`` is the number
    of texts per ONNX run.
    """

    model_dir: str
    fastembed_model: str = Field(default=FASTEMBED_MODEL)
    model_name: str = Field(default="all-MiniLM-L6-v2-int8")
    threads: int | None = Field(default=None)
    batch_size: int = Field(default=32, gt=0)

    _model: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("embed_batch_size", kwargs.get("batch_size", 32))
        super().__init__(**kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "LocalEmbedding"

    def _get_model(self) -> Any:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    from fastembed import TextEmbedding

                    self._model = TextEmbedding(
                        self.fastembed_model,
                        threads=self.threads,
                        specific_model_path=self.model_dir,
                        local_files_only=True,
                    )
        return self._model

    def _embed(self, texts: list[str]) -> list[list[float]]:
        vectors = self._get_model().embed(texts, batch_size=self.batch_size)
        return [v.tolist() for v in vectors]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query])[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await asyncio.to_thread(self._embed, [query]))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await asyncio.to_thread(self._embed, [text]))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._embed, texts)
