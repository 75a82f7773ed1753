"""`LocalEmbedding`: all-MiniLM-L6-v2 (int8 ONNX) on the CPU through fastembed.

fastembed runs the ONNX file with onnxruntime (no PyTorch) and does the mean pooling
and normalisation of sentence-transformers. The sequence length is capped at
``max_length`` tokens (256, the model's own limit, by default): fastembed's default of
512 costs 3x the time for no gain on this model.

Batching: the texts of one call are sorted by length and cut into ONNX runs
of at most ``batch_size`` texts and ``max_batch_chars`` padded characters, then the
vectors are put back in the callers' order. Long passages (a 256-token abstract) then
run one at a time, which on a 2-core CPU is the fastest and keeps the onnxruntime
arena small (32 abstracts per run grew the process to 1.7 GB), while short texts such
as queries still share runs. The vectors do not depend on the grouping.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import Field, PrivateAttr

from ..calls import door

logger = logging.getLogger(__name__)

_WHAT = "the embedding model"

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
    small config files fastembed reads, with truncation at ``max_length``.

    Other processes read this folder while it is assembled (a server chunking the
    documents of an ``index/add`` reads ``tokenizer.json`` on each call), so a file is
    written only when its content differs, and then whole (`_put`): a reader sees the
    old file or the new one, never a truncated one."""
    if not 8 <= max_length <= 512:
        raise ValueError("max_length must be between 8 and 512")
    folder = root / f"all-MiniLM-L6-v2-int8-L{max_length}"
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.onnx"
    if not model.exists():
        try:
            os.link(onnx, model)
        except OSError:  # another file system, or another process linked it first
            _put(model, onnx.read_bytes())
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
        _put(folder / name, json.dumps(content).encode())
    _put(folder / "tokenizer.json", tokenizer.read_bytes())
    return folder


def _put(path: Path, data: bytes) -> None:
    """``path`` holding ``data``: left alone when it already does, else written to a
    temporary file beside it and renamed over it (atomic on one file system)."""
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass  # missing or unreadable: written below
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, not the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def length_batches(
    texts: Sequence[str],
    batch_size: int,
    max_batch_chars: int | None,
    *,
    sort: bool = True,
) -> list[list[int]]:
    """Indexes of ``texts`` grouped into ONNX runs.

    With ``sort`` the texts go shortest first (a stable order), so each run pads to a
    length close to its texts' own. A run holds at most ``batch_size`` texts and, if
    ``max_batch_chars`` is set, at most that many characters once padded to its longest
    text (a longer text runs alone). Every index appears exactly once.
    """
    order = sorted(range(len(texts)), key=lambda i: len(texts[i])) if sort else range(len(texts))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        size = max(longest, len(texts[i]))
        full = len(current) >= batch_size or (
            max_batch_chars is not None and size * (len(current) + 1) > max_batch_chars
        )
        if current and full:
            batches.append(current)
            current, size = [], len(texts[i])
        current.append(i)
        longest = size
    if current:
        batches.append(current)
    return batches


class LocalEmbedding(BaseEmbedding):
    """A fastembed ONNX sentence embedding model as a LlamaIndex embedding.

    ``model_dir`` holds ``model.onnx``, ``tokenizer.json`` and fastembed's config
    files; ``fastembed_model`` names the registered architecture (pooling,
    dimension). ``threads`` is onnxruntime's intra-op thread count: the usable cores
    when unset, ``0`` leaves it to onnxruntime (fastembed passes the same number as the
    inter-op count, which sequential execution does not use). ``batch_size`` is the most
    texts per ONNX run and ``max_batch_chars`` the most characters per run once padded to
    its longest text (None: only ``batch_size`` counts); ``sort_by_length`` sorts the
    texts of a call by length before grouping them (see `length_batches`).

    The async methods run the blocking ones on this model's worker threads
    (`door.arun`: never on the event loop nor its default executor); cancelling the
    await abandons the call. They take no deadline (LlamaIndex's methods have none), so
    a search calls the blocking ones through `door.arun` itself, under its deadline
    (``async_on_workers``).
    """

    calls_at_once: ClassVar[int] = os.cpu_count() or 1
    """Embedding runs at once on the model's worker threads (`door`): each run uses
    every core, so more only wait, and each would cost a thread started while the
    cores are busy (the event loop's stall when an async burst starts them)."""

    async_on_workers: ClassVar[bool] = True
    """The async methods this class defines only run its blocking ones on its worker
    threads: a search that bounds its calls runs the blocking ones itself
    (`search.loops`); a subclass's own async method is awaited as native."""

    model_dir: str
    fastembed_model: str = Field(default=FASTEMBED_MODEL)
    model_name: str = Field(default="all-MiniLM-L6-v2-int8")
    threads: int | None = Field(default=None, ge=0)
    batch_size: int = Field(default=32, gt=0)
    max_batch_chars: int | None = Field(default=1024, gt=0)
    sort_by_length: bool = Field(default=True)

    _model: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _warned_cut: bool = PrivateAttr(default=False)
    _warned_query_cut: bool = PrivateAttr(default=False)

    def __init__(self, **kwargs: Any) -> None:
        # LlamaIndex hands `_get_text_embeddings` chunks of `embed_batch_size` texts: give
        # it large ones, so the sort by length sees many texts at once.
        kwargs.setdefault("embed_batch_size", max(256, kwargs.get("batch_size", 32)))
        super().__init__(**kwargs)
        if self.threads is None:
            self.threads = usable_cores()

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's serialisation name of this class."""
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

    def _embed(self, texts: list[str], query: bool = False) -> list[list[float]]:
        """``texts``' vectors; ``query``: ``texts`` is one question (`_warn_if_cut`)."""
        model = self._get_model()
        if not (self._warned_query_cut if query else self._warned_cut):
            self._warn_if_cut(model, texts, query)
        out: list[list[float]] = [[] for _ in texts]
        for batch in length_batches(
            texts, self.batch_size, self.max_batch_chars, sort=self.sort_by_length
        ):
            vectors = model.embed([texts[i] for i in batch], batch_size=len(batch))
            for i, vector in zip(batch, vectors, strict=True):
                out[i] = vector.tolist()
        return out

    def fit_to_window(self, text: str) -> str:
        """``text`` cut where the model cuts it (after its last token within the
        limit), so it embeds to the same vector with nothing dropped unseen: what
        `TransformRetriever` does with a generated passage, which nobody chunked."""
        tokenizer, limit = _window(self._get_model())
        if tokenizer is None or not limit or len(text) <= limit - 2:
            return text
        encoding = tokenizer.encode(text)
        if not encoding.overflowing:
            return text
        end = max((stop for _, stop in encoding.offsets), default=len(text))
        return text[:end]

    def _warn_if_cut(self, model: Any, texts: list[str], query: bool = False) -> None:
        """Warn once when texts are longer than the model's token limit: their ends are
        silently dropped (LlamaIndex's default 1,024-token chunks meet a 256-token
        model). Only texts longer in characters than the limit can be, so short ones
        cost nothing; the tokenizer says which overflow. A question (``query``) gets
        its own warning, once: its end is not searched, and no splitter helps."""
        tokenizer, limit = _window(model)
        if tokenizer is None or not limit:
            return
        long = [t for t in texts if len(t) > limit - 2]
        if not long:
            return
        cut = sum(1 for enc in tokenizer.encode_batch(long) if enc.overflowing)
        if not cut:
            return
        if query:
            self._warned_query_cut = True
            logger.warning(
                "%s cut a question at its %d-token limit: the rest of the question is "
                "not searched. Ask a shorter question, or put what it asks first; "
                "warned once",
                self.model_name,
                limit,
            )
            return
        self._warned_cut = True
        logger.warning(
            "%s cut %d of %d texts at its %d-token limit: the rest of each is not "
            "embedded, so not searchable. Split documents with this model's own "
            "token count: Settings.node_parser = "
            "llama_index_hyde_plus.splitter_for(embed_model) (as hyde-plus index "
            "does); warned once",
            self.model_name,
            cut,
            len(texts),
            limit,
        )

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query], query=True)[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await self._aembed([query], query=True))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await self._aembed([text]))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await self._aembed(texts)

    async def _aembed(self, texts: list[str], query: bool = False) -> list[list[float]]:
        """`_embed` on this model's worker threads (its provider's pool)."""
        call = partial(self._embed, texts, query)
        return await door.arun(call, on=self, what=_WHAT)


def _window(model: Any) -> tuple[Any, int | None]:
    """The fastembed model's tokenizer and its token limit (None, None if unknown)."""
    tokenizer = getattr(getattr(model, "model", None), "tokenizer", None)
    limit = (getattr(tokenizer, "truncation", None) or {}).get("max_length")
    return tokenizer, limit
