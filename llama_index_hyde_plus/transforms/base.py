"""`QueryTransformer`, the base of every transform, and its output `TransformResult`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, ClassVar, Literal, cast

from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.schema import QueryBundle

from .._checks import check_int, check_number, is_number, validate_query
from ..calls import door
from ..calls.reliability import describe, failure
from ..events import QueryTransformEndEvent, QueryTransformStartEvent, dispatcher, listening
from ..search.expansion import check_weight
from ..search.fusion import RRF_K, FusionMode
from ..usage import Usage, sum_usage
from .parsing import QueryCount

logger = logging.getLogger(__name__)


FEEDBACK_WEIGHTS = (1e-6, 1e6)
"""The range of a non-zero Rocchio weight (``alpha``, ``beta``). Only their ratio
matters (the search vector is scaled to unit length), and beyond this range the
arithmetic overflows or underflows to a zero vector that ranks nothing."""


def check_feedback_weight(value: Any, name: str) -> float:
    """``value`` as a float if it is 0 or in `FEEDBACK_WEIGHTS`; else a `TypeError` or
    a `ValueError` naming ``name``."""
    low, high = FEEDBACK_WEIGHTS
    weight = check_number(value, name, 0.0, high)
    if 0 < weight < low:
        raise ValueError(
            f"{name} must be 0 or between {low:g} and {high:g} (only the ratio of alpha "
            f"to beta matters), not {value!r}"
        )
    return weight


@dataclass(frozen=True)
class SearchSpec:
    """One search a transform asks for.

    ``text`` is what keyword and hybrid search match; ``embedding_strs`` are embedded
    and averaged into the dense search vector (LlamaIndex's ``custom_embedding_strs``).
    """

    text: str
    embedding_strs: tuple[str, ...]
    passages: tuple[str, ...] = ()
    """Generated passages, embedded as documents and mixed into the dense vector."""
    query: str | None = None
    """The original question, embedded as a query, when it joins ``passages``."""
    query_weight: float = 0.0
    """The question's share of the dense vector when ``passages`` are set."""
    weight: float = 1.0
    """This search's weight in the fusion of a fan-out (the question's own list can
    count more than a paraphrase's)."""
    embedding: tuple[float, ...] | None = None
    """A vector searched as given (a core transform's ``QueryBundle.embedding``), as
    core's ``TransformRetriever`` searches it: nothing is embedded for this search."""


Strategy = Literal["replace", "rerank"]


def check_strategy(value: Any) -> Strategy:
    """``value`` if it is a `Strategy` (``"replace"`` or ``"rerank"``); else the one
    `ValueError` every option that takes a strategy raises."""
    if not (isinstance(value, str) and value in ("replace", "rerank")):
        raise ValueError(f"strategy must be 'replace' or 'rerank', not {value!r}")
    return cast(Strategy, value)


@dataclass(frozen=True)
class Guards:
    """How far a transform may move the question's own search, as options a
    `TransformRetriever` carries out (it has the embedder and the question's hits).

    ``context_k``: the question's top hits shown to the generator (grounded HyDE).
    ``strategy``: ``"replace"`` searches with the generated text; ``"rerank"`` keeps
    the question's own candidates and only reorders them by
    ``(1 - blend) * score(question) + blend * similarity(generated text)``, so recall
    at the candidate depth is the question's by construction.
    ``gate``: skip the expansion for a query whose generated text has a cosine
    similarity to the question below ``gate`` (the result says why; not a failure).
    ``feedback_k`` / ``feedback_alpha`` / ``feedback_beta``: Rocchio pseudo-relevance
    feedback, ``alpha * q + beta * mean(top-k document vectors)``.
    """

    context_k: int = 0
    strategy: Strategy = "replace"
    blend: float = 0.3
    gate: float | None = None
    gate_relative: float | None = None
    feedback_k: int = 0
    feedback_alpha: float = 1.0
    feedback_beta: float = 0.0

    def __post_init__(self) -> None:
        check_int(self.context_k, "context_k", 0, 20)
        check_strategy(self.strategy)
        check_weight(self.blend, "blend", allow_none=False)
        if self.gate is not None:
            if not is_number(self.gate):
                raise TypeError(f"gate must be a number or None, not {type(self.gate).__name__}")
            if not -1.0 <= float(self.gate) <= 1.0:  # NaN fails this too
                raise ValueError("gate must be a cosine similarity between -1 and 1, or None")
            object.__setattr__(self, "gate", float(self.gate))
        if self.gate_relative is not None:
            object.__setattr__(
                self, "gate_relative", check_number(self.gate_relative, "gate_relative", 0.0, 2.0)
            )
        check_int(self.feedback_k, "feedback_k", 0, 100)
        for name in ("feedback_alpha", "feedback_beta"):
            object.__setattr__(self, name, check_feedback_weight(getattr(self, name), name))

    @property
    def needs_question_hits(self) -> bool:
        """Whether the question must be searched before the transform runs."""
        return (
            self.context_k > 0
            or self.strategy == "rerank"
            or self.feedback_k > 0
            or self.gate_relative is not None
        )

    def check_chainable(self, name: str) -> None:
        """The one `ValueError` of `QueryTransformer.then` when these guards act on one
        question's own search (rerank, grounding, feedback, a gate), which a stage of a
        chain cannot do; nothing when they do not. ``name`` is the transform's, for the
        message."""
        if self.needs_question_hits or self.gate is not None:
            raise ValueError(
                f"then() cannot compose {name} with a rerank strategy, grounding, feedback "
                "or a gate (they act on one question's own search); use it on its own, or "
                "without those options"
            )


NO_GUARDS = Guards()


@dataclass(frozen=True)
class TransformResult:
    """What a transform made of one query: what to search, what it cost, and how it went.

    The public fields, what an app reads (``SearchResult.transform``, ``query --json``):

    - ``query``: the question as asked; ``method``: the transform's name (``"hyde"``,
      ``"multi-query"``, ``"a+b"`` for ``a.then(b)``, or your class's).
    - ``queries``: the generated queries only, never the question as asked (empty
      for HyDE, which writes passages, for a fallback and for a transform that
      generates nothing); ``hypothetical``: HyDE's passages after trimming;
      ``include_query``: whether the question is searched too; `search_queries`: what
      is searched, in order (the question first when it is).
    - ``parsed``: for a list transform, the queries asked for, those kept and why the
      rest of the reply was left out (`QueryCount`).
    - ``usage``: the LLM calls' `Usage` (zero for a cache hit); ``cached`` and
      ``generation_usage``: a cache hit and what the original call cost;
      ``latency_s``: the transform's wall time.
    - ``fallback`` and ``error``: the question was searched as asked because the
      transform failed, and why; ``skipped``: why a guard kept the question's own
      search (not a failure); ``children``: the per-query results of a composed
      transform.

    How the output is searched, filled by the transform and read by
    `TransformRetriever` (through `searches`); a transform of your own may leave them
    at their defaults: ``specs`` (the searches it chose itself, e.g. HyDE's weighted
    mix), ``original_weight`` (a fan-out's weight for the question's own list),
    ``search_options`` (the options it reports, shown in `to_dict`) and ``defaults``
    (which shipped defaults applied: ``"small"``, ``"capable"``, None when chosen).
    They stay fields of the result, not of the retriever's plan: `searches` reads
    ``specs`` and ``original_weight`` itself, and ``to_dict``/``from_dict`` carry
    the others through every cache.
    """

    query: str
    """The question as asked."""
    method: str
    """The transform's name, as `eval --transforms` and RCP spell it."""
    queries: tuple[str, ...]
    """The generated queries, trimmed to ``max_characters``; never the question as asked
    unless a transform wrote it as its output (a rewrite or sub-question equal to it).
    Empty when nothing was generated: HyDE (its passages are ``hypothetical``), a
    fallback, plain search."""
    hypothetical: tuple[str, ...] = ()
    """HyDE's passages, each trimmed to ``max_characters`` at a sentence end (else a
    word break), without repeats."""
    include_query: bool = True
    """Whether the question as asked is searched too."""
    usage: Usage = field(default_factory=Usage)
    """Tokens, calls and cost of this transform's LLM calls (zero for a cache hit)."""
    fallback: bool = False
    """The transform failed and the question is searched as asked (see ``error``)."""
    error: str | None = None
    """Why it fell back, or (without ``fallback``) why some of its calls failed or
    replied with nothing while others succeeded: the exception's class and message."""
    latency_s: float = 0.0
    """Wall time of the transform in seconds, LLM calls included."""
    children: tuple[TransformResult, ...] = ()
    """Per-query results of a composed transform (``a.then(b)``): one per search of ``a``."""
    cached: bool = False
    """Served from a cache, or shared with an identical concurrent request: no LLM call
    was made for it, so ``usage`` is zero."""
    generation_usage: Usage | None = None
    """For a cached result, the usage of the call that first generated it."""
    specs: tuple[SearchSpec, ...] = ()
    """The searches the transform chose for its output itself (HyDE: one search mixing
    the question and the passages with its weights). Empty: the default plan, one search
    per `search_queries`, or the plain mean of question and passages when there are
    ``hypothetical`` passages. Not in `to_dict`: the transform fills them again on a
    cache hit."""
    search_options: dict[str, Any] = field(default_factory=dict, hash=False)
    """The transform's own search options, as it reports them (HyDE: ``query_weight``,
    ``keyword_weight``). Shown in `to_dict`; the search follows ``specs``, not these."""
    original_weight: float = 1.0
    """Fan-out: the fusion weight of the question's own list (paraphrases count 1)."""
    skipped: str | None = None
    """Why the expansion was not used for this query (a gate), when it was not. Not a
    failure: nothing is logged as a warning."""
    defaults: str | None = None
    """Which shipped defaults chose the search options: ``"small"`` (the bundled
    SmolLM2-135M) or ``"capable"`` (any other LLM); None when the caller chose them."""
    parsed: QueryCount | None = None
    """What a list transform (`MultiQuery`, `Decompose`) made of its reply: the queries
    asked for, those kept, and why the other items were left out (the question
    repeated, a repeat, an echo of the prompt, no query...). Set on its fallback too
    when the reply held no usable query; None for the other transforms."""

    @classmethod
    def fallback_for(
        cls, query: str, method: str, error: str, *, usage: Usage | None = None
    ) -> TransformResult:
        """The result that searches ``query`` as asked because ``method`` failed.

        Args:
            query: the question, searched as asked.
            method: the name of the transform that failed.
            error: why it failed (the exception's class and message).
            usage: what the failed calls still cost; None: nothing.
        """
        return cls(
            query=query,
            method=method,
            queries=(),
            include_query=True,
            usage=usage or Usage(),
            fallback=True,
            error=error,
        )

    @property
    def search_queries(self) -> tuple[str, ...]:
        """The queries to search: the original first when ``include_query``, then the
        generated ones, without repeats. For HyDE this is just the original query."""
        if self.hypothetical:
            return (self.query,)
        head = (self.query,) if self.include_query else ()
        out: list[str] = []
        for q in (*head, *self.queries):
            if q not in out:
                out.append(q)
        return tuple(out) or (self.query,)

    @property
    def embedding_strs(self) -> tuple[str, ...]:
        """Strings whose embeddings average into the search vector (LlamaIndex's
        ``custom_embedding_strs``): the one search's, else every search's in order."""
        searches = self.searches()
        if len(searches) == 1:
            return searches[0].embedding_strs
        return tuple(text for spec in searches for text in spec.embedding_strs)

    def searches(self) -> list[SearchSpec]:
        """The searches to run, one ranked list each."""
        if self.children:  # a chain: the message's own child keeps its weight
            return [
                replace(spec, weight=spec.weight * self._child_weight(child))
                for child in self.children
                for spec in child.searches()
            ]
        if self.specs:
            return list(self.specs)
        if self.hypothetical:
            return [self._plain_mean()]
        head = self.query if self.include_query else None
        return [
            SearchSpec(
                text=q,
                embedding_strs=(q,),
                weight=self.original_weight if q == head else 1.0,
            )
            for q in self.search_queries
        ]

    def _child_weight(self, child: TransformResult) -> float:
        """A chain child's weight: ``original_weight`` for the one run on the question
        itself (when it is searched), 1 for the others."""
        own = self.include_query and child.query == self.query
        return self.original_weight if own else 1.0

    def _plain_mean(self) -> SearchSpec:
        """The passages searched as the HyDE paper does: their mean with the question's
        (when ``include_query``) as the dense vector, all of them as the keyword text."""
        head = (self.query,) if self.include_query else ()
        return SearchSpec(
            text="\n\n".join(head + self.hypothetical),
            embedding_strs=(*self.hypothetical, *head),
            passages=self.hypothetical,
            query=self.query,
            query_weight=len(head) / (len(self.hypothetical) + len(head)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able record (what ``query --json`` shows and a cache of JSON
        stores, read back by `from_dict`): the fields, with ``search_options`` merged in at the
        top level; ``specs`` are left out, and ``children``, ``cached``,
        ``generation_usage``, ``original_weight``, ``skipped``, ``defaults`` and
        ``parsed`` only appear when set."""
        out: dict[str, Any] = {
            "query": self.query,
            "method": self.method,
            "queries": list(self.queries),
            "hypothetical": list(self.hypothetical),
            "include_query": self.include_query,
            "usage": self.usage.to_dict(),
            "fallback": self.fallback,
            "error": self.error,
            "latency_s": round(self.latency_s, 6),
        }
        if self.children:
            out["children"] = [c.to_dict() for c in self.children]
        if self.cached:
            out["cached"] = True
        if self.generation_usage is not None:
            out["generation_usage"] = self.generation_usage.to_dict()
        out.update(self.search_options)
        if self.original_weight != 1.0:
            out["original_weight"] = self.original_weight
        if self.skipped:
            out["skipped"] = self.skipped
        if self.defaults:
            out["defaults"] = self.defaults
        if self.parsed is not None:
            out["parsed"] = self.parsed.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformResult:
        """Inverse of `to_dict` (used by the caches): a record of any other shape (a
        field missing or of another type, `check_record`) is a `ValueError` naming the
        field, never coerced into a result."""
        check_record(data)
        generation = data.get("generation_usage")
        return cls(
            query=data["query"],
            method=data["method"],
            queries=tuple(data["queries"]),
            hypothetical=tuple(data["hypothetical"]),
            include_query=data["include_query"],
            usage=Usage.from_dict(data["usage"]),
            fallback=data["fallback"],
            error=data["error"],
            latency_s=float(data["latency_s"]),
            children=tuple(cls.from_dict(c) for c in data.get("children", ())),
            cached=bool(data.get("cached", False)),
            generation_usage=Usage.from_dict(generation) if generation else None,
            search_options={k: v for k, v in data.items() if k not in _GENERIC_KEYS},
            original_weight=float(data.get("original_weight", 1.0)),
            skipped=data.get("skipped"),
            defaults=data.get("defaults"),
            parsed=QueryCount.from_dict(data["parsed"]) if "parsed" in data else None,
        )


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _optional_str(value: object) -> bool:
    return value is None or isinstance(value, str)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _usage_record(value: object) -> bool:
    """A `Usage.to_dict` record: whole token and call counts, a cost, source names."""
    if not isinstance(value, dict):
        return False
    counts = ("input_tokens", "output_tokens", "total_tokens", "calls", "tokens_saved")
    return (
        all(type(value.get(k, 0)) is int for k in counts)
        and _number(value.get("cost", 0.0))
        and all(isinstance(value.get(k, "none"), str) for k in ("usage_source", "cost_source"))
    )


_RECORD_FIELDS: dict[str, tuple[bool, Any]] = {
    "query": (True, lambda v: isinstance(v, str)),
    "method": (True, lambda v: isinstance(v, str)),
    "queries": (True, _strings),
    "hypothetical": (True, _strings),
    "include_query": (True, lambda v: isinstance(v, bool)),
    "usage": (True, _usage_record),
    "fallback": (True, lambda v: isinstance(v, bool)),
    "error": (True, _optional_str),
    "latency_s": (True, _number),
    "children": (False, lambda v: isinstance(v, list)),
    "cached": (False, lambda v: isinstance(v, bool)),
    "generation_usage": (False, lambda v: v is None or _usage_record(v)),
    "original_weight": (False, _number),
    "skipped": (False, _optional_str),
    "defaults": (False, _optional_str),
    "parsed": (False, QueryCount.valid),
}
"""Each field of a `TransformResult.to_dict` record: whether it is always written, and
what its value must be (``queries`` a list of strings, ``usage`` a usage record...)."""


def check_record(data: object) -> None:
    """A `ValueError` naming the first field of ``data`` that is missing or of another
    shape or type than `TransformResult.to_dict` writes (`_RECORD_FIELDS`); the
    ``children`` are checked as they are decoded.

    Args:
        data: what a cache returned for a key."""
    if not isinstance(data, dict):
        raise ValueError(f"a result record is a dict, not {type(data).__name__}")
    for name, (required, valid) in _RECORD_FIELDS.items():
        if name not in data:
            if required:
                raise ValueError(f"the result record has no {name!r}")
        elif not valid(data[name]):
            raise ValueError(f"the result record's {name!r} is malformed: {data[name]!r:.80}")
    parsed = data.get("parsed")
    if parsed is not None and parsed["kept"] != len(data["queries"]):
        raise ValueError(
            f"the result record's 'parsed' counts {parsed['kept']} queries kept, "
            f"its 'queries' hold {len(data['queries'])}"
        )


_GENERIC_KEYS = frozenset(
    (
        *("query", "method", "queries", "hypothetical", "include_query", "usage"),
        *("fallback", "error", "latency_s", "children", "cached", "generation_usage"),
        *("original_weight", "skipped", "defaults", "parsed"),
    )
)
"""The keys `TransformResult.to_dict` writes for its own fields; any other key is one
of the transform's `search_options`."""


def revised(result: TransformResult, **changes: Any) -> TransformResult:
    """``dataclasses.replace(result, **changes)`` in a fifth of its time, for the
    paths a cache hit takes (a hit is a few of these and little else): the result's
    fields copied as they are, ``changes`` set over them. Exact, as `TransformResult`
    has no ``__post_init__`` and no field outside ``__init__``; an unknown name is a
    `TypeError`, as with ``replace``.

    Args:
        result: The result to copy.
        changes: Fields to set on the copy."""
    unknown = changes.keys() - _RESULT_FIELDS
    if unknown:
        raise TypeError(f"TransformResult has no field(s) {sorted(unknown)}")
    copy = object.__new__(TransformResult)
    vars(copy).update(vars(result), **changes)
    return copy


_RESULT_FIELDS = frozenset(f.name for f in fields(TransformResult))


def _method_name(obj: QueryTransformer) -> str:
    return obj.method or type(obj).__name__


MAX_N = 10
"""The most queries (``n``) or passages a transform writes per question."""


def _emit_start(transformer: QueryTransformer, query: str) -> bool:
    """Emit the start event when a handler listens; whether one does (the end event
    is emitted only then: the handlers are looked for once per transform)."""
    if not listening():
        return False
    dispatcher.event(QueryTransformStartEvent(query=query, method=_method_name(transformer)))
    return True


def _emit_end(result: TransformResult) -> None:
    dispatcher.event(
        QueryTransformEndEvent(
            query=result.query,
            method=result.method,
            queries=list(result.queries),
            hypothetical=list(result.hypothetical),
            include_query=result.include_query,
            usage=result.usage.to_dict(),
            fallback=result.fallback,
            error=result.error,
            latency_s=result.latency_s,
        )
    )


def coerce_result(
    transformer: QueryTransformer, query: str, value: Any, latency_s: float
) -> TransformResult:
    """Turn what a ``transform()`` returned (str, list of str, TransformResult) into a
    `TransformResult`. Anything else is a `TypeError`."""
    method = _method_name(transformer)
    if isinstance(value, TransformResult):
        if value.latency_s:
            return value
        return revised(value, latency_s=latency_s)
    include = bool(getattr(transformer, "include_query", False))
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("transform() returned an empty string")
        return TransformResult(
            query=query,
            method=method,
            queries=(text,),
            include_query=include,
            latency_s=latency_s,
        )
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        queries = tuple(v.strip() for v in value if v.strip())
        if not queries:
            raise ValueError("transform() returned no queries")
        return TransformResult(
            query=query,
            method=method,
            queries=queries,
            include_query=include,
            latency_s=latency_s,
        )
    raise TypeError(
        f"{type(transformer).__name__}.transform() must return str, list[str] or "
        f"TransformResult, not {type(value).__name__}"
    )


class QueryTransformer(BaseQueryTransform):
    """Base class of every query transform.

    Subclass it and override `transform` (returning a ``str``, a ``list[str]`` or a
    `TransformResult`); the default `atransform` runs it in a worker thread so the
    event loop is never blocked. Built-in transforms implement `atransform` natively.

    It is also a LlamaIndex ``BaseQueryTransform``: ``run()`` returns a ``QueryBundle``
    whose ``query_str`` is the ORIGINAL question (so answer prompts see the user's
    words) and whose ``custom_embedding_strs`` are the strings to embed, so core's
    ``TransformQueryEngine`` and ``TransformRetriever`` accept it as is.
    """

    method: ClassVar[str] = ""
    """Name reported in `TransformResult.method`; the class name when empty."""
    default_fusion: ClassVar[FusionMode] = FusionMode.RRF
    """Fusion a `TransformRetriever` uses for this transform unless told otherwise."""
    rrf_k: int = RRF_K
    """The ``k`` of RRF, ``w / (k + rank)``, when this transform's lists are fused by RRF:
    the smaller, the more the top ranks of each list count."""
    include_query: bool = False
    """Whether the original query is searched too. False for a custom transformer, whose
    returned query (or queries) is what gets searched, as its author wrote it."""
    guards: Guards = NO_GUARDS
    """How a `TransformRetriever` may use this transform's output (see `Guards`)."""

    uses_llm: ClassVar[bool] = False
    """Whether the transform calls an LLM (see `searches_question`)."""

    @property
    def searches_question(self) -> bool:
        """Whether the searches this transform asks for include the question as asked,
        on its own (a fan-out's first list): a `TransformRetriever` then searches it
        while the LLM writes. True for an LLM transform that includes the query."""
        return self.include_query and self.uses_llm

    def search_advice(self, search_type: str) -> str | None:
        """A warning for a `TransformRetriever` whose store matches by ``search_type``
        (``dense``, ``keyword``, ``hybrid``) when this transform is configured in a way
        that store serves badly; None when there is nothing to say."""
        return None

    def transform(self, query: str) -> Any:
        """Rewrite ``query``. Returns a `TransformResult` (built-ins) or, in a user's
        subclass, a ``str`` / ``list[str]`` / `TransformResult`."""
        raise NotImplementedError(f"{type(self).__name__} must implement transform()")

    async def atransform(self, query: str) -> Any:
        """Async twin of `transform`; by default ``transform()`` on a worker thread of
        this transform's own (never the event loop's default executor, which the app's
        own jobs may fill); cancelling the await abandons it."""
        call = partial(self.transform, query)
        return await door.arun(call, on=self, kind="store", what="the transform")

    # -- safe wrappers used by the retriever and run() -------------------------------
    def transform_safe(
        self, query: str, *, context: Sequence[str] | None = None
    ) -> TransformResult:
        """`transform` that never raises on a failure of the transform itself: it is
        logged and becomes a fallback. A bad ``query`` is still a `ValueError`.
        Emits the start and end instrumentation events. ``context`` (the question's
        top passages) is passed on only to transforms whose guards ask for it."""
        validate_query(query)
        start = time.perf_counter()
        told = _emit_start(self, query)
        try:
            if context is not None and self.guards.context_k:
                value = self.transform(query, context=context)  # type: ignore[call-arg]
            else:
                value = self.transform(query)
            result = coerce_result(self, query, value, time.perf_counter() - start)
        except BaseException as exc:
            result = self._failed(query, failure(exc), start)  # interrupts go on up
        if told:
            _emit_end(result)
        return result

    async def atransform_safe(
        self, query: str, *, context: Sequence[str] | None = None
    ) -> TransformResult:
        """`atransform` that never raises (cancellation still propagates)."""
        validate_query(query)
        start = time.perf_counter()
        told = _emit_start(self, query)
        try:
            if context is not None and self.guards.context_k:
                value = await self.atransform(query, context=context)  # type: ignore[call-arg]
            else:
                value = await self.atransform(query)
            result = coerce_result(self, query, value, time.perf_counter() - start)
        except BaseException as exc:
            result = self._failed(query, failure(exc, in_task=True), start)  # ours propagates
        if told:
            _emit_end(result)
        return result

    def _failed(self, query: str, exc: Exception, start: float) -> TransformResult:
        error = describe(exc)
        logger.error(
            "query transform %s raised %s; searching with the original query",
            _method_name(self),
            error,
        )
        result = TransformResult.fallback_for(query, _method_name(self), error)
        return replace(result, latency_s=time.perf_counter() - start)

    def chain_stage(self) -> QueryTransformer:
        """This transform as a stage of a chain (`then`): itself, unless its guards act
        on one question's own search, which a chain cannot do (a `ValueError`)."""
        self.guards.check_chainable(type(self).__name__)
        return self

    def then(self, other: QueryTransformer) -> ChainTransform:
        """Feed each search query of this transform to ``other`` (e.g.
        ``Decompose(n=3).then(HyDE())`` runs HyDE for every sub-question)."""
        return ChainTransform(self, other)

    # -- LlamaIndex BaseQueryTransform -----------------------------------------------
    def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
        result = self.transform_safe(query_bundle.query_str)
        return QueryBundle(
            query_str=query_bundle.query_str,
            custom_embedding_strs=list(result.embedding_strs),
        )

    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        return None


class ChainTransform(QueryTransformer):
    """``first.then(second)``: ``second`` runs on every search query of ``first``.

    On the async path all of ``second``'s runs go concurrently. Results are fused
    with ``first``'s preferred fusion (interleave for `Decompose`).
    """

    def __init__(self, first: QueryTransformer, second: QueryTransformer) -> None:
        if not isinstance(first, QueryTransformer) or not isinstance(second, QueryTransformer):
            raise TypeError("then() composes QueryTransformer instances")
        first, second = first.chain_stage(), second.chain_stage()
        super().__init__()
        self.first = first
        self.second = second
        self.include_query = first.include_query

    @property
    def default_fusion(self) -> FusionMode:  # type: ignore[override]
        return self.first.default_fusion

    @property
    def rrf_k(self) -> int:  # type: ignore[override]
        """The first stage's RRF constant: its lists are the ones fused."""
        return self.first.rrf_k

    def search_advice(self, search_type: str) -> str | None:
        return self.first.search_advice(search_type) or self.second.search_advice(search_type)

    @property
    def method(self) -> str:  # type: ignore[override]
        return f"{_method_name(self.first)}+{_method_name(self.second)}"

    def _combine(
        self, head: TransformResult, children: list[TransformResult], start: float
    ) -> TransformResult:
        usage = sum_usage([head.usage, *(c.usage for c in children)])
        return TransformResult(
            query=head.query,
            method=self.method,
            queries=head.queries,
            hypothetical=tuple(p for c in children for p in c.hypothetical),
            include_query=head.include_query,
            usage=usage,
            fallback=head.fallback,
            error=head.error,
            latency_s=time.perf_counter() - start,
            children=tuple(children),
            original_weight=head.original_weight,
            parsed=head.parsed,
        )

    def transform(self, query: str) -> TransformResult:
        start = time.perf_counter()
        head = self.first.transform_safe(query)
        children = [self.second.transform_safe(q) for q in head.search_queries]
        return self._combine(head, children, start)

    async def atransform(self, query: str) -> TransformResult:
        start = time.perf_counter()
        head = await self.first.atransform_safe(query)
        children = await asyncio.gather(
            *(self.second.atransform_safe(q) for q in head.search_queries)
        )
        return self._combine(head, list(children), start)

    def _get_prompt_modules(self) -> dict[str, Any]:
        return {"first": self.first, "second": self.second}
