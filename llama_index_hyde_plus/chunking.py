"""Split documents into chunks that fit the embedding model's window, with LlamaIndex's
own node parsers: `MarkdownNodeParser` first for Markdown (so a chunk never spans two
sections), then `SentenceSplitter`.

Tokens are counted with the embedding model's own tokenizer when it has one (the local
model's ``tokenizer.json``), else with tiktoken's ``cl100k_base`` (OpenAI's embedding
models). A document that fits in one chunk keeps its id; the chunks of a longer one are
``<doc id>#1``, ``<doc id>#2``... Each chunk records its file (``source``), its place
(``chunk`` of ``chunks``, ``start_char``/``end_char`` in the document's text when found
there) and LlamaIndex's SOURCE/PREVIOUS/NEXT relationships.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core import Document
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode, NodeRelationship, RelatedNodeInfo, TextNode

DEFAULT_CHUNK_SIZE = 200
DEFAULT_CHUNK_OVERLAP = 20
MARKDOWN_SUFFIXES = (".md", ".markdown")

#: Sentences by punctuation. `SentenceSplitter`'s default sentence tokenizer is NLTK's
#: punkt, whose data files recent NLTK refuses to open when they are hard links (as uv
#: installs them); splitting is only the first cut, chunks are merged to size after.
_SENTENCES = r"[^.!?]*[.!?]+\s*|[^.!?]+$"

Tokenizer = Callable[[str], list[Any]]


@dataclass(frozen=True)
class Chunking:
    """Chunks of at most ``size`` tokens, consecutive chunks of one document sharing
    ``overlap`` tokens."""

    size: int = DEFAULT_CHUNK_SIZE
    overlap: int = DEFAULT_CHUNK_OVERLAP

    def check(self, max_length: int) -> None:
        """A `ValueError` naming the option when a chunk would not fit the model's
        window (``max_length`` tokens) or the overlap is not smaller than a chunk."""
        if self.size < 1:
            raise ValueError(f"--chunk-size must be at least 1 token, not {self.size}")
        if self.size > max_length:
            raise ValueError(
                f"--chunk-size {self.size} is more than --max-length {max_length}: the "
                "embedding model would cut every full chunk; lower --chunk-size"
            )
        if not 0 <= self.overlap < self.size:
            raise ValueError(
                f"--chunk-overlap must be at least 0 and less than --chunk-size "
                f"{self.size}, not {self.overlap}"
            )

    def as_meta(self, tokenizer: str) -> dict[str, Any]:
        """The settings as recorded beside an index."""
        return {"chunk_size": self.size, "chunk_overlap": self.overlap, "tokenizer": tokenizer}


def tokenizer_for(embed_model: BaseEmbedding) -> tuple[str, Tokenizer | None]:
    """``(name, count function)`` of the tokens ``embed_model`` sees: its own
    ``tokenizer.json`` (the local model), else None for tiktoken ``cl100k_base``."""
    model_dir = getattr(embed_model, "model_dir", None)
    path = Path(str(model_dir)) / "tokenizer.json" if model_dir else None
    if path is None or not path.is_file():
        return "cl100k_base", None
    from tokenizers import Tokenizer as HFTokenizer

    tokenizer = HFTokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()  # fastembed's file pads to the window: count real tokens

    def encode(text: str) -> list[Any]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    name = str(getattr(embed_model, "model_name", "") or "model")
    return f"{name} (tokenizer.json)", encode


def splitter_for(
    embed_model: BaseEmbedding,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    chunk_overlap: int = DEFAULT_CHUNK_OVERLAP,
) -> Any:
    """A LlamaIndex `SentenceSplitter` whose chunks fit ``embed_model``: it counts
    ``chunk_size`` in the model's own tokens (`tokenizer_for`: the local model's
    ``tokenizer.json``, else tiktoken's ``cl100k_base``, OpenAI's), where a plain
    `SentenceSplitter` counts tiktoken's and lets chunks past a 256-token model's
    window. ``Settings.node_parser = splitter_for(embed_model)``, or
    ``transformations=[splitter_for(embed_model)]``; `hyde-plus index` splits the same
    way (plus Markdown sections)."""
    chunking = Chunking(chunk_size, chunk_overlap)
    chunking.check(chunk_size)  # a size of at least 1, an overlap below it
    return _sentence_splitter(chunking, tokenizer_for(embed_model)[1])


def _sentence_splitter(chunking: Chunking, tokenizer: Tokenizer | None) -> Any:
    """LlamaIndex's `SentenceSplitter` to ``chunking``, counting with ``tokenizer``."""
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.node_parser.text.utils import split_by_regex

    return SentenceSplitter(
        chunk_size=chunking.size,
        chunk_overlap=chunking.overlap,
        tokenizer=tokenizer,
        chunking_tokenizer_fn=split_by_regex(_SENTENCES),
    )


def split_documents(
    documents: Sequence[Document], chunking: Chunking, tokenizer: Tokenizer | None = None
) -> list[TextNode]:
    """The chunks of ``documents``, in order (see the module's docstring)."""
    from llama_index.core.node_parser import MarkdownNodeParser

    splitter = _sentence_splitter(chunking, tokenizer)
    markdown = MarkdownNodeParser()
    nodes: list[TextNode] = []
    for doc in documents:
        # metadata is kept out of the text that is embedded, so it costs no tokens
        doc.excluded_embed_metadata_keys = list(doc.metadata)
        doc.excluded_llm_metadata_keys = list(doc.metadata)
        parts: Sequence[BaseNode] = [doc]
        if str(doc.metadata.get("source", "")).lower().endswith(MARKDOWN_SUFFIXES):
            parts = markdown.get_nodes_from_documents([doc])
            for part in parts:  # its header_path too
                part.excluded_embed_metadata_keys = list(part.metadata)
                part.excluded_llm_metadata_keys = list(part.metadata)
        chunks = splitter(parts)  # splits sections as it splits documents
        nodes.extend(_chunk_nodes(doc, [(c.get_content(), dict(c.metadata)) for c in chunks]))
    return nodes


def _chunk_nodes(doc: Document, chunks: list[tuple[str, dict[str, Any]]]) -> list[TextNode]:
    """Nodes with stable ids, positions and relationships for the chunks of ``doc``."""
    ids = [f"{doc.doc_id}#{n}" for n in range(1, len(chunks) + 1)]
    if len(chunks) == 1:
        ids = [doc.doc_id]
    nodes: list[TextNode] = []
    cursor = 0
    for n, (text, meta) in enumerate(chunks):
        start = doc.text.find(text, cursor)
        meta = {**meta, "doc_id": doc.doc_id, "chunk": n + 1, "chunks": len(chunks)}
        if start >= 0:
            meta.update(start_char=start, end_char=start + len(text))
            cursor = start + 1
        relationships = {NodeRelationship.SOURCE: RelatedNodeInfo(node_id=doc.doc_id)}
        if n > 0:
            relationships[NodeRelationship.PREVIOUS] = RelatedNodeInfo(node_id=ids[n - 1])
        if n + 1 < len(chunks):
            relationships[NodeRelationship.NEXT] = RelatedNodeInfo(node_id=ids[n + 1])
        nodes.append(
            TextNode(
                id_=ids[n],
                text=text,
                metadata=meta,
                excluded_embed_metadata_keys=list(meta),
                excluded_llm_metadata_keys=list(meta),
                relationships=relationships,
                start_char_idx=meta.get("start_char"),
                end_char_idx=meta.get("end_char"),
            )
        )
    return nodes
