"""Command-line options that several commands share, declared once (help included).
Light: imports typer, `_names` and `_model_spec` only."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from .._model_spec import LLM_CHOICES, LLM_KEY_ENV, LLM_MODEL_ENV
from ._names import STORE_KINDS, TIMEOUT_POLICY

MODEL_HELP = "auto, local or openai[:MODEL]."
LLM_HELP = (
    f"{LLM_CHOICES} (an OpenAI-compatible server: the model in --llm-model, else its "
    "first; a key in --llm-key if it needs one)."
)

Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens (INFO).")]
Llm = Annotated[str, typer.Option(help=LLM_HELP)]
EvalLlm = Annotated[
    str,
    typer.Option(
        help=LLM_HELP[:-1] + ", or oracle:P[:N], a stand-in for a strong model that answers "
        "with a judged-relevant document with probability P (removed from the index and the "
        "judgements; needs questions with 2+ relevant documents), N draws averaged (3)."
    ),
]
LlmModel = Annotated[
    str | None,
    typer.Option(
        "--llm-model",
        help=f"The server's model (--llm http://... or ollama); default ${LLM_MODEL_ENV}, "
        "else the first it lists.",
    ),
]
LlmKey = Annotated[
    str | None,
    typer.Option(
        "--llm-key",
        help=f"The server's API key (--llm http://...); default ${LLM_KEY_ENV}, else none. "
        "Never printed or recorded.",
    ),
]


@dataclass(frozen=True)
class LlmFlags:
    """``--llm`` with ``--llm-model`` and ``--llm-key``, as given (the key never shown)."""

    spec: str
    model: str | None = None
    key: str | None = field(default=None, repr=False)

    def resolve(self, **kwargs: Any) -> Any:
        """`models.resolve_llm` of these flags, with its other keywords."""
        from ..models import resolve_llm

        return resolve_llm(self.spec, server_model=self.model, server_key=self.key, **kwargs)


Embed = Annotated[str, typer.Option(help=MODEL_HELP)]
Temperature = Annotated[float | None, typer.Option(help="LLM temperature.")]
Timeout = Annotated[
    float | None, typer.Option(help=f"Seconds one LLM call may take (default: {TIMEOUT_POLICY}).")
]
Uri = Annotated[str | None, typer.Option(help="Milvus Lite file or cluster URL (hybrid search).")]
Collection = Annotated[str, typer.Option(help="Milvus collection name.")]
MilvusToken = Annotated[
    str | None,
    typer.Option("--milvus-token", help="Milvus cluster token.", envvar="MILVUS_TOKEN"),
]
IndexPath = Annotated[Path | None, typer.Option("--index", "-i", help="FAISS index folder.")]
StoreKind = Annotated[
    str | None,
    typer.Option(
        help=f"{' or '.join(STORE_KINDS)} (Milvus: hybrid BM25 + dense; the default with --uri)."
    ),
]
MaxLength = Annotated[int, typer.Option(help="Embedding max tokens per text (local model).")]
Count = Annotated[
    int | None,
    typer.Option(
        "--num-queries", "-n", help="How many queries (multi-query, decompose; default 3)."
    ),
]
NumPassages = Annotated[int | None, typer.Option(help="HyDE passages to average (default 1).")]

# evaluation and tuning
Dataset = Annotated[
    Path, typer.Option(help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv).")
]
OptDataset = Annotated[
    Path | None,
    typer.Option(
        help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv), or a "
        "conversational set (corpus.jsonl, turns/SPLIT.jsonl)."
    ),
]
"""eval's ``--dataset``: a BEIR folder or a conversational set."""
TuneDataset = Annotated[
    Path | None,
    typer.Option(help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv)."),
]
"""tune's ``--dataset``: a BEIR folder (a conversational set is refused)."""
Limit = Annotated[int | None, typer.Option(help="Only the first N judged queries.")]
HydePrompt = Annotated[
    str | None,
    typer.Option(help="HyDE paper prompt by task (scifact, fiqa, trec-covid...) or a template."),
]
Concurrency = Annotated[int, typer.Option(help="Queries in flight at once.")]
EvalTemperature = Annotated[float, typer.Option(help="LLM sampling temperature.")]
MaxTokens = Annotated[int, typer.Option(help="Max tokens per LLM reply.")]
Seed = Annotated[int, typer.Option(help="Sampling seed (local LLM).")]
CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", help="Where indexes and transform outputs are cached."),
]
