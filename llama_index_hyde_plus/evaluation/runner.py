"""Run transforms over a BEIR dataset and score them.

The index is cached by corpus content and embedding model, so a re-run does not
re-embed. Transform outputs go through a `SQLiteCache`, so a re-run, or a run resumed
after an interruption, makes no new LLM calls for the queries it already did.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM

from .._suggest import did_you_mean
from ..cache import SQLiteCache, TransformCache
from ..retriever import TransformRetriever
from ..stores import FaissStore, Store, store_for
from ..stores.choice import store_classes
from ..transforms._listing import QueryListTransform
from ..transforms.factory import build
from ..transforms.registry import (
    TRANSFORMS,
    check_options,
    transform_class,
    uses_llm,
)
from ..usage import Usage, sum_usage
from ..vectors import Embedder
from .beir import BeirDataset
from .metrics import MEASURES, evaluate, paired_interval, paired_t_test, percentile
from .standin import (
    Draw,
    ScoreAll,
    SeedRun,
    StandIn,
    draw,
    eligible,
    merge_seeds,
    oracle_llm,
    plain_rankings,
    reduced,
    right_share,
    stored_vectors,
)

if TYPE_CHECKING:
    from typing_extensions import Required, Unpack

ProgressFactory = Callable[[str, int], Callable[[int], None]]
"""``start(description, total)`` returns ``advance(n)``; the CLI draws progress bars."""

_ALIAS = re.compile(r"^(?P<name>[a-z-]+?)(?:-n(?P<n>\d+))?(?P<q>\+q)?$")

logger = logging.getLogger(__name__)


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


def split_transforms(text: str) -> list[str]:
    """``"none,hyde:query_weight=0.8,gate=0.7,rocchio"`` -> ``["none",
    "hyde:query_weight=0.8,gate=0.7", "rocchio"]``: a comma starts a new transform
    unless what follows is another ``key=value`` of the previous one."""
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if out and ":" in out[-1] and "=" in piece and ":" not in piece:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


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
        count = transform_class(name).count_option() if name in TRANSFORMS else None
        options[count or "n"] = int(match["n"])
    if match["q"]:
        options["include_query"] = True
    return _checked(TransformSpec(spec, name, options))


def _checked(spec: TransformSpec) -> TransformSpec:
    """``spec`` with its name made canonical, once its options are known to build the
    transform (a `ValueError` naming the spec before any work is done)."""
    try:
        name = transform_class(spec.name).method
    except ValueError:
        raise ValueError(
            f"unknown transform {spec.name!r} in {spec.label!r}"
            f"{did_you_mean(spec.name, TRANSFORMS)}; use one of {', '.join(TRANSFORMS)}"
        ) from None
    try:
        check_options(name, dict(spec.options))
    except ValueError as exc:
        raise ValueError(f"{spec.label}: {exc}") from None
    return replace(spec, name=name)


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
    wins: int = 0
    ties: int = 0
    losses: int = 0
    """Queries whose nDCG@10 is above, equal to, below `none`'s."""
    delta_vs_none: float | None = None
    """Mean nDCG@10 minus `none`'s."""
    skipped: int = 0
    """Queries whose expansion a gate skipped."""
    timeouts: int = 0
    """Queries whose generation ran out of time (the LLM's, or waiting for a worker)."""
    interval_vs_none: tuple[float, float] | None = None
    """95% interval of the mean per-query nDCG@10 difference with `none` (paired t)."""
    options: dict[str, Any] = field(default_factory=dict)
    rankings: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    """Each query's ranked document ids (to tell a configuration that changes nothing)."""
    identical_to_none: bool = False
    """Every query's ranking equals `none`'s: the configuration is a no-op here."""
    changed: int = 0
    """How many queries' rankings differ from `none`'s (of those both ranked)."""

    @property
    def verdict(self) -> str:
        """The comparison with `none` in words: helps / hurts / no clear difference."""
        return verdict(self.delta_vs_none, self.p_value_vs_none)

    def gains(self, alpha: float = 0.05) -> bool:
        """Whether this beats `none` as a recommendation requires: a positive difference,
        significant (p < ``alpha``), on a score that is not mostly plain search's (at
        most a tenth of its queries fell back). `eval` and `tune` decide by this."""
        return (
            (self.delta_vs_none or 0.0) > 0
            and self.p_value_vs_none is not None
            and self.p_value_vs_none < alpha
            and self.fallbacks <= 0.1 * max(self.queries, 1)
        )

    def compare_with(self, baseline: TransformReport) -> None:
        """Fill the paired comparison with ``baseline`` (the `none` run)."""
        mine, base = self.per_query_ndcg, baseline.per_query_ndcg
        keys = set(mine) & set(base)
        self.wins = sum(1 for k in keys if mine[k] > base[k] + 1e-9)
        self.losses = sum(1 for k in keys if mine[k] < base[k] - 1e-9)
        self.ties = len(keys) - self.wins - self.losses
        self.delta_vs_none = self.scores["nDCG@10"] - baseline.scores["nDCG@10"]
        self.p_value_vs_none = paired_t_test(mine, base)
        self.interval_vs_none = paired_interval(mine, base)
        ranked = set(self.rankings) & set(baseline.rankings)
        self.changed = sum(1 for k in ranked if self.rankings[k] != baseline.rankings[k])
        self.identical_to_none = bool(ranked) and self.changed == 0

    def to_dict(self) -> dict[str, Any]:
        """This transform's record in ``results.json``'s ``results``: the scores
        (4 decimals), latency, usage and cost, and the comparison with `none`."""
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
            "delta_ndcg@10_vs_none": None
            if self.delta_vs_none is None
            else round(self.delta_vs_none, 5),
            "delta_ndcg@10_ci95_vs_none": None
            if self.interval_vs_none is None
            else [_round(x) for x in self.interval_vs_none],
            "wins": self.wins,
            "ties": self.ties,
            "losses": self.losses,
            "verdict": self.verdict if self.delta_vs_none is not None else None,
            "skipped_by_gate": self.skipped,
            "changed_rankings": self.changed,
            "identical_to_none": self.identical_to_none,
            "per_query_ndcg@10": {k: round(v, 4) for k, v in sorted(self.per_query_ndcg.items())},
            "options": self.options,
            "examples": self.examples,
        }


def verdict(delta: float | None, p_value: float | None, alpha: float = 0.05) -> str:
    """``delta`` (nDCG@10 against `none`, 0-1 scale) and its p-value in words, in
    nDCG points: "helps: +1.2 nDCG@10, p = 0.010" / "hurts: ..." / "no clear
    difference: ..."."""
    if delta is None:
        return "baseline"
    points = f"{delta * 100:+.1f} nDCG@10"
    p_text = "p = 1" if p_value is None else f"p = {p_value:.3f}"
    if p_value is not None and p_value < alpha and abs(delta) > 1e-9:
        return f"{'helps' if delta > 0 else 'hurts'}: {points}, {p_text}"
    return f"no clear difference: {points}, {p_text}"


def _round(x: float) -> float | None:
    return None if x != x else round(x, 4)  # NaN -> None


@dataclass
class EvalResult:
    """One `eval` run: the dataset, its size, the configuration and one
    `TransformReport` per transform, with the time per phase."""

    dataset: str
    queries: int
    documents: int
    config: dict[str, Any]
    reports: list[TransformReport]
    index_seconds: float
    index_cached: bool
    wall_seconds: float = 0.0
    unit: str = "documents"
    """What ``documents`` counts: ``documents``, or ``chunks`` (`BeirDataset.unit`)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per phase, in the order they ran: ``index`` (build or load) and one per
    transform label, after what a command did first (`include_earlier`: loading the
    models, reading the dataset or writing questions). ``wall_seconds`` is the whole."""

    def include_earlier(self, earlier: dict[str, float], total: float) -> None:
        """Count the phases that ran before `run_eval` (``earlier``, in order) and make
        ``total``, the whole command's time, the wall time.

        Args:
            earlier: seconds per phase that ran first, in order.
            total: the whole command's seconds.
        """
        self.phases = {**earlier, **self.phases}
        self.wall_seconds = total

    def to_dict(self) -> dict[str, Any]:
        """The ``results.json`` record (`write_outputs` adds the command)."""
        return {
            "dataset": self.dataset,
            "queries": self.queries,
            "documents": self.documents,
            "unit": self.unit,
            "config": self.config,
            "index_seconds": round(self.index_seconds, 2),
            "index_cached": self.index_cached,
            "wall_seconds": round(self.wall_seconds, 1),
            "phase_seconds": {k: round(v, 1) for k, v in self.phases.items()},
            "results": [r.to_dict() for r in self.reports],
        }


def _corpus_key(ds: BeirDataset, embed_label: str) -> str:
    """What a cached index depends on: the corpus content and the embedding."""
    return hashlib.sha256(f"{ds.corpus_sha256}|{embed_label}".encode()).hexdigest()


def index_cache_dir(ds: BeirDataset, embed_label: str, root: Path) -> Path:
    """Where the FAISS index of ``ds`` under ``embed_label`` lives in the cache."""
    return root / "indexes" / corpus_index_name(ds, embed_label)


def corpus_index_name(ds: BeirDataset, embed_label: str) -> str:
    """The name of the index of ``ds`` under ``embed_label`` in any store: the
    dataset's name and a key of its content and embedding."""
    return re.sub(r"\W", "_", ds.name) + "-" + _corpus_key(ds, embed_label)[:20]


def eval_store(
    ds: BeirDataset,
    embed_label: str,
    root: Path,
    kind: str = "faiss",
    uri: str | None = None,
    token: str = "",
) -> Store:
    """The store the index of ``ds`` is cached in: a FAISS folder under ``root``, or a
    collection at the Milvus ``uri``."""
    if store_classes().get(kind, FaissStore).address == "folder":  # as `index_cache_dir`
        name = corpus_index_name(ds, embed_label)
    else:
        name = re.sub(r"\W", "_", f"{ds.name}_{_corpus_key(ds, embed_label)[:12]}")
    return store_for(kind, name, root=root, uri=uri, token=token)


def cached_index(
    ds: BeirDataset,
    store: Store,
    embed_model: BaseEmbedding,
    embed_label: str,
    *,
    max_length: int = 256,
    batch_size: int = 32,
    progress: ProgressFactory | None = None,
    vectors: Mapping[str, Sequence[float]] | None = None,
) -> tuple[VectorStoreIndex, float, bool]:
    """``(index, build seconds, reused)``: the index of ``ds`` in ``store``, reused
    when it was built from the same corpus and embedding, else built (from
    ``vectors``, each document's stored vector, when given: no embedding). A cached
    index that cannot be read (a damaged file) is built again, with a warning: it is
    a cache, not the user's index."""
    meta = store.meta()
    if meta is not None and meta.get("embed") == embed_label:
        try:
            return store.load(embed_model), 0.0, True
        except ValueError as exc:
            logger.warning(
                "the cached index %s cannot be read (%s); building it again", store.location, exc
            )
    docs = ds.documents()
    what = "Embedding corpus"
    if vectors is not None:  # an index's own vectors, reused: nothing is embedded again
        what = "Indexing stored vectors"
        for doc in docs:
            doc.embedding = list(vectors[doc.doc_id])
    advance = progress(f"{what} ({store.kind})", len(docs)) if progress else None
    info = store.build(
        docs,
        embed_model,
        embed_spec=embed_label,
        max_length=max_length,
        batch_size=batch_size,
        progress=advance,
    )
    return store.load(embed_model), info.seconds, False


def check_holds(index: VectorStoreIndex, ds: BeirDataset, where: str) -> None:
    """A `ValueError` unless ``index`` holds every document of ``ds`` by id with the
    same text (an index reused for ``--docs`` must be of exactly those chunks)."""
    differ = []
    for doc_id, (_, text) in ds.corpus.items():
        node = index.docstore.get_node(doc_id, raise_error=False)
        if node is None or node.get_content() != text:
            differ.append(doc_id)
    if differ:
        raise ValueError(
            f"--index {where} does not hold the same chunks as the documents "
            f"({len(differ)} of {len(ds.corpus)} missing or changed, e.g. {differ[0]!r}); "
            "rebuild it with `hyde-plus index` on them, or leave out --index"
        )


def needs_llm(name: str) -> bool:
    """Whether the transform called ``name`` calls an LLM (its class says)."""
    return uses_llm(name)


def build_transform(
    spec: TransformSpec, llm: LLM | None, cache: TransformCache | None, hyde_prompt: str | None
) -> Any:
    """The transform of ``spec`` (through `transforms.factory.build`: the timeout is
    the one policy, by the model's kind)."""
    return build(spec.name, llm, spec.options, cache=cache, task=hyde_prompt)


@dataclass
class _QueryRecord:
    """What one query's search did, for the report."""

    qid: str
    latency_s: float
    cached: bool
    fallback: bool
    skipped: bool
    usage: Usage
    timed_out: bool
    queries: list[str]
    hypothetical: list[str]


async def _run_one(
    retriever: TransformRetriever,
    ds: BeirDataset,
    concurrency: int,
    advance: Callable[[int], None] | None,
) -> tuple[dict[str, dict[str, float]], list[_QueryRecord]]:
    gate = asyncio.Semaphore(concurrency)
    run: dict[str, dict[str, float]] = {}
    records: list[_QueryRecord] = []

    async def one(qid: str, text: str) -> None:
        async with gate:
            start = time.perf_counter()
            result = await retriever.asearch(text)
            latency = time.perf_counter() - start
        run[qid] = {n.node.node_id: float(n.score or 0.0) for n in result.nodes}
        t = result.transform
        records.append(
            _QueryRecord(
                qid=qid,
                latency_s=latency,
                cached=t.cached or any(c.cached for c in t.children),
                fallback=t.fallback,
                skipped=bool(t.skipped),
                usage=t.generation_usage or t.usage,
                timed_out=(t.error or "").startswith(("LLMTimeoutError", "QueuedTooLongError")),
                queries=list(t.search_queries),
                hypothetical=list(t.hypothetical),
            )
        )
        if advance:
            advance(1)

    await asyncio.gather(*(one(qid, text) for qid, text in ds.queries.items()))
    return run, records


class SessionOptions(TypedDict, total=False):
    """The options of an `EvalSession`, which `run_eval` and `run_tune` pass on:
    ``embed_model``, ``embed_label`` (recorded with the index) and ``cache_root`` are
    required; the others default as in `SESSION_DEFAULTS`."""

    embed_model: Required[BaseEmbedding]
    embed_label: Required[str]
    cache_root: Required[Path]
    max_length: int
    top_k: int
    concurrency: int
    use_cache: bool
    store: str
    milvus_uri: str | None
    milvus_token: str
    progress: ProgressFactory | None
    vectors: Mapping[str, Sequence[float]] | None
    index_store: Store | None


SESSION_DEFAULTS: dict[str, Any] = {
    "max_length": 256,
    "top_k": 100,
    "concurrency": 4,
    "use_cache": True,
    "store": "faiss",
    "milvus_uri": None,
    "milvus_token": "",
    "progress": None,
    "vectors": None,
    "index_store": None,
}
"""The `SessionOptions` an `EvalSession` fills in when they are not given."""


class EvalSession:
    """One dataset, its index (built once, cached on disk), one embedder shared by
    every run (so a sweep embeds each question and passage once) and the SQLite cache
    of transform outputs (so a sweep generates once per query). `score` runs one
    transform over every query and returns its report."""

    def __init__(self, ds: BeirDataset, **options: Unpack[SessionOptions]) -> None:
        """``options``: `SessionOptions` (the models, the cache root, the store and the
        depth); the optional ones default as in `SESSION_DEFAULTS`."""
        o: dict[str, Any] = {**SESSION_DEFAULTS, **options}
        if o["concurrency"] < 1:
            raise ValueError("concurrency must be >= 1")
        self.ds = ds
        self.top_k, self.concurrency, self.progress = o["top_k"], o["concurrency"], o["progress"]
        store, uri = o["store"], o["milvus_uri"]  # checked by `store_for`, before indexing
        embed_model, label, root = o["embed_model"], o["embed_label"], o["cache_root"]
        if o["index_store"] is not None:  # the user's own index of these documents
            self.store = o["index_store"]
            start = time.perf_counter()
            self.index = self.store.load(embed_model)
            check_holds(self.index, ds, self.store.location)
            self.index_seconds, self.index_cached = time.perf_counter() - start, True
        else:
            self.store = eval_store(ds, label, root, store, uri, o["milvus_token"])
            self.index, self.index_seconds, self.index_cached = cached_index(
                ds,
                self.store,
                embed_model,
                label,
                max_length=o["max_length"],
                progress=self.progress,
                vectors=o["vectors"],
            )
        self._options = o
        embed_model.get_query_embedding("warm up")  # load the model outside the timings
        self.embedder = Embedder(embed_model, max_entries=200_000, max_bytes=1 << 30)
        self.cache = SQLiteCache(root / "eval" / "transforms.sqlite") if o["use_cache"] else None
        self._retriever: Any = None

    def derived(self, ds: BeirDataset, vectors: Mapping[str, Sequence[float]]) -> EvalSession:
        """A session over ``ds`` (a subset of this one's corpus) in its own store,
        built from ``vectors`` (this index's stored ones: nothing is embedded again),
        sharing this session's embedder; stand-in answers are not cached. Never the
        user's ``index_store``: it holds the whole corpus, the documents left out too."""
        options = {**self._options, "vectors": vectors, "use_cache": False, "index_store": None}
        session = EvalSession(ds, **options)
        session.embedder = self.embedder
        return session

    def base_retriever(self) -> Any:
        """The store's own retriever (one per session: its vectors are reused)."""
        if self._retriever is None:
            self._retriever = self.store.retriever(self.index, self.top_k)
        return self._retriever

    def score(
        self, label: str, transformer: Any, *, options: dict[str, Any] | None = None
    ) -> TransformReport:
        """Run ``transformer`` over every query and score it (no comparison yet)."""
        retriever = TransformRetriever(
            self.base_retriever(), transformer, top_k=self.top_k, embed_model=self.embedder
        )
        advance = self.progress(label, len(self.ds.queries)) if self.progress else None
        run, records = asyncio.run(_run_one(retriever, self.ds, self.concurrency, advance))
        retriever.close()
        scores = evaluate(self.ds.qrels, run, MEASURES)
        fresh = [r.latency_s for r in records if not r.cached]
        examples = [
            {
                "qid": r.qid,
                "queries": r.queries,
                "hypothetical": r.hypothetical,
                "fallback": r.fallback,
            }
            for r in sorted(records, key=lambda r: str(r.qid))[:3]
        ]
        return TransformReport(
            label=label,
            scores=scores.mean,
            per_query_ndcg=scores.per_query["nDCG@10"],
            latency_p50_s=percentile(fresh, 50),
            latency_p95_s=percentile(fresh, 95),
            latency_n=len(fresh),
            usage=sum_usage([r.usage for r in records]),
            fallbacks=sum(1 for r in records if r.fallback),
            cached=sum(1 for r in records if r.cached),
            queries=len(records),
            examples=examples,
            skipped=sum(1 for r in records if r.skipped),
            timeouts=sum(1 for r in records if r.timed_out),
            options=dict(options or {}),
            rankings={qid: tuple(docs) for qid, docs in run.items()},
        )

    def close(self) -> None:
        """Close the SQLite cache of transform outputs the session opened, if any."""
        if self.cache is not None:
            self.cache.close()


def compare(reports: Sequence[TransformReport]) -> None:
    """Fill every report's paired comparison with the `none` report among them."""
    baseline = next((r for r in reports if r.label == "none"), None)
    if baseline is None:
        return
    for report in reports:
        if report is not baseline:
            report.compare_with(baseline)


def fresh_llm(llm: LLM | Callable[[], LLM] | None) -> LLM | None:
    """``llm`` itself, or a new one when it is a zero-argument factory."""
    return llm() if callable(llm) and not isinstance(llm, LLM) else llm


def _score(
    session: EvalSession,
    spec: TransformSpec,
    llm: LLM | Callable[[], LLM] | None,
    hyde_prompt: str | None,
) -> TransformReport:
    """One transform's report; a factory gives each transform a fresh LLM, so seeded
    sampling does not depend on which transforms ran before in this process."""
    model = fresh_llm(llm) if needs_llm(spec.name) else None
    warm_up = getattr(model, "warm_up", None)
    if callable(warm_up):
        warm_up()  # a local model loads outside the timings
    transformer = build_transform(spec, model, session.cache, hyde_prompt)
    return session.score(spec.label, transformer, options=spec.options)


def answer_kind(name: str) -> str:
    """What a stand-in writes for the transform ``name``: generated queries for a
    fan-out (a `QueryListTransform`), else a passage."""
    return "query" if issubclass(transform_class(name), QueryListTransform) else "passage"


def run_standin(
    session: EvalSession, standin: StandIn, score_all: ScoreAll
) -> tuple[list[TransformReport], dict[str, Any]]:
    """Score with the stand-in generator (`standin` module): for each seed, draw the
    answers, build the reduced index from ``session``'s stored vectors, and call
    ``score_all(reduced session, llm_for)`` (its reports, ``none`` first); the reports
    are averaged per question over the seeds and compared with ``none``. Returns the
    reports and what to record about the stand-in."""
    ds = session.ds
    qids = eligible(ds)
    if not qids:
        raise ValueError(
            "--llm oracle needs questions with at least two relevant documents "
            "(one is given to the stand-in, the others are scored); this set has none"
        )
    retriever = session.base_retriever()
    rankings = plain_rankings(retriever, ds, qids)
    vectors = stored_vectors(retriever, list(ds.corpus))
    runs: list[SeedRun] = []
    for seed in standin.seeds:
        draws = draw(ds, rankings, standin.p, seed, depth=standin.depth)
        sub = reduced(ds, draws)
        tag = f"{standin.label}:seed={seed}"

        def llm_for(name: str, draws: dict[str, Draw] = draws, tag: str = tag) -> Any:
            kind = answer_kind(name)  # the text comes from the full corpus
            return oracle_llm(ds, draws, kind, characters=standin.characters, label=tag)

        child = session.derived(sub, vectors)
        try:
            runs.append(SeedRun(score_all(child, llm_for), draws))
        finally:
            child.close()
    reports = merge_seeds(runs)
    compare(reports)
    info = {
        "stand_in": standin.describe(),
        "p": standin.p,
        "seeds": list(standin.seeds),
        "questions": reports[0].queries if reports else 0,
        "eligible_questions": len(qids),
        "right_share": round(right_share(runs), 4),
    }
    return reports, info


def with_none(specs: Sequence[TransformSpec]) -> list[TransformSpec]:
    """``specs`` with ``none`` first (the stand-in compares within each seed)."""
    rest = [s for s in specs if s.name != "none"]
    head = [s for s in specs if s.name == "none"] or [TransformSpec("none", "none")]
    return head[:1] + rest


def run_eval(
    ds: BeirDataset,
    transforms: Sequence[str | TransformSpec],
    *,
    llm: LLM | Callable[[], LLM] | None,
    hyde_prompt: str | None = None,
    config: dict[str, Any] | None = None,
    standin: StandIn | None = None,
    **options: Unpack[SessionOptions],
) -> EvalResult:
    """Evaluate each transform in ``transforms`` on ``ds`` (see module docstring).

    ``llm`` is an LLM, or a zero-argument factory called once per transform (the CLI
    passes one so that each transform samples from a fresh, seeded local model).
    ``hyde_prompt`` is a HyDE paper prompt by task or a template; ``config`` is recorded
    in the report; ``standin`` scores with the strong-generator stand-in instead of
    ``llm`` (`run_standin`); ``options`` are the `EvalSession` options (`SessionOptions`).
    """
    specs = [t if isinstance(t, TransformSpec) else parse_transform_spec(t) for t in transforms]
    if not specs:
        raise ValueError("transforms must name at least one transform")
    if llm is None and standin is None and any(needs_llm(s.name) for s in specs):
        raise ValueError("an llm is needed for transforms other than none and rocchio")
    wall = time.perf_counter()
    session = EvalSession(ds, **options)
    phases = {"index": time.perf_counter() - wall}
    extra: dict[str, Any] = {}
    try:
        if standin is None:
            reports = []
            for spec in specs:
                start = time.perf_counter()
                reports.append(_score(session, spec, llm, hyde_prompt))
                phases[spec.label] = time.perf_counter() - start
            compare(reports)
        else:
            specs = with_none(specs)

            def score_all(child: EvalSession, llm_for: Callable[[str], Any]) -> list[Any]:
                return [_score(child, s, partial(llm_for, s.name), hyde_prompt) for s in specs]

            start = time.perf_counter()
            reports, extra = run_standin(session, standin, score_all)
            phases["stand-in runs"] = time.perf_counter() - start
    finally:
        session.close()
    result = EvalResult(
        dataset=ds.name,
        queries=len(ds.queries),
        documents=len(ds.corpus),
        unit=ds.unit,
        config={**(config or {}), **extra},
        reports=reports,
        index_seconds=session.index_seconds,
        index_cached=session.index_cached,
        phases=phases,
    )
    result.wall_seconds = time.perf_counter() - wall
    return result
