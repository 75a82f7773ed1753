"""Run transforms over a BEIR dataset and score them.

The index is cached by corpus content and embedding model, so a re-run does not
re-embed. Transform outputs go through a `SQLiteCache`, so a re-run, or a run resumed
after an interruption, makes no new LLM calls for the queries it already did.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM

from ..cache import SQLiteCache, TransformCache
from ..retriever import TransformRetriever
from ..transforms.prompts import HYDE_PAPER_PROMPTS
from ..transforms.registry import METHODS, make_transform
from ..usage import Usage, sum_usage
from .beir import BeirDataset
from .metrics import MEASURES, evaluate, paired_t_test, percentile

#: ``start(description, total)`` returns ``advance(n)``; the CLI draws progress bars.
ProgressFactory = Callable[[str, int], Callable[[int], None]]

_ALIAS = re.compile(r"^(?P<name>[a-z-]+?)(?:-n(?P<n>\d+))?(?P<q>\+q)?$")


@dataclass(frozen=True)
class TransformSpec:
    """A transform to evaluate: its label in reports, registry name and options."""

    label: str
    name: str
    options: dict[str, Any] = field(default_factory=dict)


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_transform_spec(spec: str) -> TransformSpec:
    """Parse ``none``, ``hyde``, ``hyde-n4`` (num_passages / n), ``hyde+q``
    (include_query), ``hyde-n4+q``, or ``NAME:key=value,...``."""
    spec = spec.strip()
    if ":" in spec:
        name, _, rest = spec.partition(":")
        parsed: dict[str, Any] = {}
        for item in filter(None, rest.split(",")):
            key, sep, val = item.partition("=")
            if not sep:
                raise ValueError(f"transform option {item!r} in {spec!r} must be key=value")
            parsed[key.strip()] = _value(val.strip())
        return _checked(TransformSpec(spec, name.strip(), parsed))
    match = _ALIAS.match(spec.lower())
    if not match:
        raise ValueError(f"cannot read transform {spec!r}")
    name = match["name"]
    options: dict[str, Any] = {}
    if match["n"]:
        options["num_passages" if name == "hyde" else "n"] = int(match["n"])
    if match["q"]:
        options["include_query"] = True
    return _checked(TransformSpec(spec, name, options))


def _checked(spec: TransformSpec) -> TransformSpec:
    if spec.name not in ("none", *METHODS):
        raise ValueError(
            f"unknown transform {spec.name!r} in {spec.label!r}; use none or one of "
            f"{', '.join(METHODS)}"
        )
    return spec


@dataclass
class TransformReport:
    """Scores and costs of one transform over the dataset."""

    label: str
    scores: dict[str, float]
    per_query_ndcg: dict[str, float]
    latency_p50_s: float
    latency_p95_s: float
    latency_n: int
    usage: Usage
    fallbacks: int
    cached: int
    queries: int
    p_value_vs_none: float | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "transform": self.label,
            **{k: round(v, 4) for k, v in self.scores.items()},
            "latency_p50_s": _round(self.latency_p50_s),
            "latency_p95_s": _round(self.latency_p95_s),
            "latency_measured_queries": self.latency_n,
            "llm_calls": self.usage.calls,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "cost_usd": round(self.usage.cost, 6),
            "usage_source": self.usage.usage_source,
            "cost_source": self.usage.cost_source,
            "fallbacks": self.fallbacks,
            "cached_transforms": self.cached,
            "queries": self.queries,
            "p_value_vs_none": None
            if self.p_value_vs_none is None
            else round(self.p_value_vs_none, 5),
            "examples": self.examples,
        }


def _round(x: float) -> float | None:
    return None if x != x else round(x, 4)  # NaN -> None


@dataclass
class EvalResult:
    dataset: str
    queries: int
    documents: int
    config: dict[str, Any]
    reports: list[TransformReport]
    index_seconds: float
    index_cached: bool
    wall_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "queries": self.queries,
            "documents": self.documents,
            "config": self.config,
            "index_seconds": round(self.index_seconds, 2),
            "index_cached": self.index_cached,
            "wall_seconds": round(self.wall_seconds, 1),
            "results": [r.to_dict() for r in self.reports],
        }


def _corpus_key(ds: BeirDataset, embed_label: str) -> str:
    """What a cached index depends on: the corpus content and the embedding."""
    return hashlib.sha256(f"{ds.corpus_sha256}|{embed_label}".encode()).hexdigest()


def index_cache_dir(ds: BeirDataset, embed_label: str, root: Path) -> Path:
    """Where the index of ``ds`` under ``embed_label`` lives in the cache."""
    key = _corpus_key(ds, embed_label)[:20]
    return root / "indexes" / f"{ds.name}-{key}"


def cached_index(
    ds: BeirDataset,
    embed_model: BaseEmbedding,
    embed_label: str,
    root: Path,
    *,
    max_length: int = 256,
    batch_size: int = 32,
    progress: ProgressFactory | None = None,
) -> tuple[VectorStoreIndex, float, bool]:
    """The FAISS index of ``ds``: loaded from the cache, or built and cached."""
    from ..indexing import build_faiss_index, load_faiss_index

    path = index_cache_dir(ds, embed_label, root)
    if (path / "hyde_plus.json").is_file():
        return load_faiss_index(path, embed_model), 0.0, True
    docs = ds.documents()
    advance = progress("Embedding corpus", len(docs)) if progress else None
    info = build_faiss_index(
        docs,
        embed_model,
        path,
        embed_spec=embed_label,
        max_length=max_length,
        batch_size=batch_size,
        progress=advance,
    )
    return load_faiss_index(path, embed_model), info.seconds, False


def cached_milvus_index(
    ds: BeirDataset,
    embed_model: BaseEmbedding,
    embed_label: str,
    uri: str,
    *,
    max_length: int = 256,
    batch_size: int = 32,
    progress: ProgressFactory | None = None,
) -> tuple[VectorStoreIndex, float, bool]:
    """The hybrid Milvus collection of ``ds`` at ``uri``: reused when its recorded
    corpus and embedding match, else built."""
    from ..milvus import build_milvus_index, load_milvus_index, read_milvus_meta

    key = _corpus_key(ds, embed_label)[:12]
    collection = re.sub(r"\W", "_", f"{ds.name}_{key}")
    meta = read_milvus_meta(uri, collection)
    if meta is not None and meta.get("embed") == embed_label:
        return load_milvus_index(uri, embed_model, collection=collection), 0.0, True
    docs = ds.documents()
    advance = progress("Embedding corpus (Milvus)", len(docs)) if progress else None
    start = time.perf_counter()
    index = build_milvus_index(
        docs,
        embed_model,
        uri,
        collection=collection,
        embed_spec=embed_label,
        max_length=max_length,
        batch_size=batch_size,
        progress=advance,
    )
    return index, time.perf_counter() - start, False


def build_transform(
    spec: TransformSpec, llm: LLM | None, cache: TransformCache | None, hyde_prompt: str | None
) -> Any:
    options = dict(spec.options)
    if spec.name == "none":
        return make_transform("none")
    if spec.name == "hyde" and hyde_prompt and "prompt" not in options:
        options["prompt"] = HYDE_PAPER_PROMPTS.get(hyde_prompt, hyde_prompt)
    if cache is not None:
        options["cache"] = cache
    # an evaluation wants every generation, not a latency bound: a slow local model
    # under load must not turn into fallbacks
    options.setdefault("timeout", 600.0)
    return make_transform(spec.name, llm, **options)


async def _run_one(
    retriever: TransformRetriever,
    ds: BeirDataset,
    concurrency: int,
    advance: Callable[[int], None] | None,
) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    gate = asyncio.Semaphore(concurrency)
    run: dict[str, dict[str, float]] = {}
    records: list[dict[str, Any]] = []

    async def one(qid: str, text: str) -> None:
        async with gate:
            start = time.perf_counter()
            result = await retriever.asearch(text)
            latency = time.perf_counter() - start
        run[qid] = {n.node.node_id: float(n.score or 0.0) for n in result.nodes}
        t = result.transform
        records.append(
            {
                "qid": qid,
                "latency_s": latency,
                "cached": t.cached or any(c.cached for c in t.children),
                "fallback": t.fallback,
                "usage": t.generation_usage or t.usage,
                "queries": list(t.search_queries),
                "hypothetical": list(t.hypothetical),
            }
        )
        if advance:
            advance(1)

    await asyncio.gather(*(one(qid, text) for qid, text in ds.queries.items()))
    return run, records


def run_eval(
    ds: BeirDataset,
    transforms: Sequence[str],
    *,
    llm: LLM | Callable[[], LLM] | None,
    embed_model: BaseEmbedding,
    embed_label: str,
    cache_root: Path,
    max_length: int = 256,
    top_k: int = 100,
    concurrency: int = 4,
    hyde_prompt: str | None = None,
    use_cache: bool = True,
    store: str = "faiss",
    milvus_uri: str | None = None,
    progress: ProgressFactory | None = None,
    config: dict[str, Any] | None = None,
) -> EvalResult:
    """Evaluate each transform in ``transforms`` on ``ds`` (see module docstring).

    ``llm`` is an LLM, or a zero-argument factory called once per transform (the CLI
    passes one so that each transform samples from a fresh, seeded local model).
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    specs = [parse_transform_spec(t) for t in transforms]
    if not specs:
        raise ValueError("transforms must name at least one transform")
    if llm is None and any(s.name != "none" for s in specs):
        raise ValueError("an llm is needed for transforms other than none")
    wall = time.perf_counter()
    if store == "milvus":
        if not milvus_uri:
            raise ValueError("store='milvus' needs milvus_uri (a file path or a cluster URL)")
        from ..milvus import hybrid_retriever

        index, index_seconds, index_cached = cached_milvus_index(
            ds, embed_model, embed_label, milvus_uri, max_length=max_length, progress=progress
        )

        def base_retriever() -> Any:
            return hybrid_retriever(index, top_k)
    elif store == "faiss":
        index, index_seconds, index_cached = cached_index(
            ds, embed_model, embed_label, cache_root, max_length=max_length, progress=progress
        )

        def base_retriever() -> Any:
            return index.as_retriever(similarity_top_k=top_k)
    else:
        raise ValueError("store must be 'faiss' or 'milvus'")
    embed_model.get_query_embedding("warm up")  # load the model outside the timings
    cache = SQLiteCache(cache_root / "eval" / "transforms.sqlite") if use_cache else None
    reports: list[TransformReport] = []
    for spec in specs:
        # a factory gives each transform a fresh LLM, so seeded sampling does not depend
        # on which transforms ran before in this process
        model = llm() if callable(llm) and not isinstance(llm, LLM) else llm
        warm_up = getattr(model, "warm_up", None)
        if spec.name != "none" and callable(warm_up):
            warm_up()  # a local model loads outside the timings
        transformer = build_transform(
            spec, model if spec.name != "none" else None, cache, hyde_prompt
        )
        retriever = TransformRetriever(base_retriever(), transformer, top_k=top_k)
        advance = progress(f"{spec.label}", len(ds.queries)) if progress else None
        run, records = asyncio.run(_run_one(retriever, ds, concurrency, advance))
        scores = evaluate(ds.qrels, run, MEASURES)
        fresh = [r["latency_s"] for r in records if not r["cached"]]
        examples = [
            {k: r[k] for k in ("qid", "queries", "hypothetical", "fallback")}
            for r in sorted(records, key=lambda r: str(r["qid"]))[:3]
        ]
        reports.append(
            TransformReport(
                label=spec.label,
                scores=scores.mean,
                per_query_ndcg=scores.per_query["nDCG@10"],
                latency_p50_s=percentile(fresh, 50),
                latency_p95_s=percentile(fresh, 95),
                latency_n=len(fresh),
                usage=sum_usage([r["usage"] for r in records]),
                fallbacks=sum(1 for r in records if r["fallback"]),
                cached=sum(1 for r in records if r["cached"]),
                queries=len(records),
                examples=examples,
            )
        )
    baseline = next((r for r in reports if r.label == "none"), None)
    if baseline is not None:
        for report in reports:
            if report is not baseline:
                report.p_value_vs_none = paired_t_test(
                    report.per_query_ndcg, baseline.per_query_ndcg
                )
    if cache is not None:
        cache.close()
    result = EvalResult(
        dataset=ds.name,
        queries=len(ds.queries),
        documents=len(ds.corpus),
        config=dict(config or {}),
        reports=reports,
        index_seconds=index_seconds,
        index_cached=index_cached,
    )
    result.wall_seconds = time.perf_counter() - wall
    return result
