"""The search, written once: each step is a generator that yields the I/O it needs.

`TransformRetriever.search` and ``asearch`` run the same generator, `search`; they
differ only in the loop that carries out what it yields (`loops.Blocking`: calls in
this thread and worker threads; `loops.Async`: awaits and tasks). A step never embeds,
searches, calls a model nor waits: it yields a request (`requests`: `Embed` and
`ReadStore` from the steps of `vectors`, `SearchQuestion`, `SearchGenerated`,
`SearchAll`, `Transform`, `Rerank`, `Start` / `Join` / `Cancel` for the question's
search while the LLM writes, `Failed` to ask whether an exception is a failure or
must propagate) and is sent the answer, or has what the call raised thrown in at the
``yield``.

Why a driver and not an async source with a generated sync twin (unasync): the two
paths do not differ by ``await`` alone. The sync path runs the question's search on a
thread and cannot cancel it, the async one runs a task beside the LLM call and
cancels it; a fan-out is threads with one shared deadline on one side and tasks under
a semaphore on the other; what counts as a failure and what must propagate depends on
the running task. A rewriting script would have to encode those differences as rules
about the source text; here they are two small functions in `loops`, and every
blocking or async call of the search sits there, in one place. What `plan` decides
and what the steps compute stays pure data and pure functions, tested once.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.schema import NodeWithScore, QueryBundle

from .._checks import validate_query
from ..calls.door import Deadline
from ..calls.reliability import describe
from ..transforms.base import (
    Guards,
    QueryTransformer,
    SearchSpec,
    TransformResult,
    revised,
)
from ..usage import Usage
from . import expansion, plan
from .fusion import explain, fuse, fusion_mode, scored, unique_nodes
from .requests import (
    Cancel,
    EmbedSteps,
    Failed,
    Join,
    Rerank,
    SearchAll,
    Searcher,
    SearchGenerated,
    SearchQuestion,
    Start,
    Steps,
    Transform,
)

logger = logging.getLogger(__name__)

Vec = list[float]
Hits = list[NodeWithScore] | None
"""The question's own hits, when it was searched first."""
Failures = list[tuple[int, str]]
"""The failed sub-searches of a fan-out: each one's position among the step's
searches and its error text."""
Carried = tuple[list[NodeWithScore], Failures]
"""A step's nodes and the failed sub-searches of a fan-out."""
Dense = tuple[Vec, list[Vec]]
"""A search's own question vector and its passages' vectors."""
Found = tuple[list[NodeWithScore], "TransformResult", Failures]
"""A search's nodes, the transform that shaped them, the failed sub-searches."""

RERANK_CANDIDATES = 50
"""How many of the question's hits a reranking transform (``strategy="rerank"``)
reorders: the one depth every caller gets (`TransformRetriever.from_index`, `HyDERAG`,
``hyde-plus query``, ``eval``, ``tune``, ``serve``). Hits past it (``eval`` and ``serve``
fetch 100) follow in the order found, so a ranking does not depend on how deep the
wrapped retriever fetched."""


@dataclass(frozen=True)
class Question:
    """What the caller asked: the text a transform rewrites, and what the question's
    own search uses.

    From a ``QueryBundle`` (`of`), as LlamaIndex's own retrievers read one: a
    precomputed ``embedding`` is the question's vector wherever it is needed (its own
    search, the HyDE mix, the gate, feedback), never embedded again;
    ``custom_embedding_strs`` replace the question's text as what is embedded for it
    (the mean of their query embeddings, as LlamaIndex aggregates them), while the
    text is still what the transform rewrites and keyword search matches. A bundle with
    no text but an embedding or embedding strings cannot be rewritten: ``text`` is
    empty and it is searched as given."""

    text: str
    embedding: Vec | None = None
    custom_strs: tuple[str, ...] = ()
    given: QueryBundle | None = None

    @classmethod
    def of(cls, query: str | QueryBundle) -> Question:
        """``query`` read as a question (a `TypeError` or `ValueError` for one that
        has neither text nor an embedding)."""
        if not isinstance(query, QueryBundle):
            return cls(validate_query(query))
        embedding = None if query.embedding is None else [float(x) for x in query.embedding]
        strs = tuple(query.custom_embedding_strs or ())
        text = query.query_str
        if isinstance(text, str) and not text.strip() and (embedding is not None or strs):
            return cls("", embedding, strs, given=query)
        return cls(validate_query(text), embedding, strs, given=query)

    @property
    def embedding_strs(self) -> tuple[str, ...]:
        """What is embedded for the question when no embedding was given."""
        return self.custom_strs or (self.text,)

    def bundle(self, embedding: Vec | None = None) -> QueryBundle:
        """The question's own search: its text, the caller's embedding (else
        ``embedding``), and the caller's embedding strings."""
        if not self.text and self.given is not None:
            return self.given  # cannot be rewritten: searched as given
        return QueryBundle(
            query_str=self.text,
            embedding=self.embedding if self.embedding is not None else embedding,
            custom_embedding_strs=list(self.custom_strs) or None,
        )

    def untransformed(self, method: str) -> TransformResult:
        """The result of a question no transform could run on (no text)."""
        return TransformResult(
            query=self.text,
            method=method,
            queries=(),
            skipped="the query has an embedding but no text to rewrite; searched as given",
        )


# -- the steps -------------------------------------------------------------------------
def search(r: Searcher, question: Question, transformed: TransformResult | None) -> Steps[Found]:
    """The nodes for ``question``, the transform that shaped them and the failed
    sub-searches. With guards that need them (grounding, rerank, feedback), the
    question is searched first and its hits are reused for the question's own list;
    what is done is decided by `plan`. ``transformed`` is a rewrite already made (the
    transform is not called again)."""
    if not question.text:  # an embedding-only bundle: searched as given
        found = unique_nodes((yield from _question_first(r, question, question.bundle())))
        nodes = yield from reranked_or_kept(r, found, question)
        return nodes, question.untransformed(method_of(r.transformer)), []
    guards = r.transformer.guards
    hits: Hits = None
    if plan.question_first(guards):
        hits = yield from _question_first(r, question)
    searching = None  # the question's own search, while the LLM writes
    if plan.overlaps(guards, r.transformer.searches_question):
        searching = yield Start(question_hits(r, question))
    context = plan.context_for(guards, hits)
    beside = searching if searching is not None and guards.needs_question_hits else None
    try:
        result = _reused(transformed) or (
            yield Transform(question.text, question.given, context, beside)
        )
    except GeneratorExit:  # a generator being closed must not yield again
        raise
    except BaseException:
        if searching is not None:
            yield Cancel(searching)
        raise
    overlapped = (yield Join(searching)) if beside is not None else None
    hits, pending = _after_overlap(hits, searching, overlapped, guards)
    result, nodes, errors = yield from _expanded(r, question, result, guards, hits, pending)
    if r.reranker is not None:
        nodes = yield from reranked_or_kept(r, nodes, question)
    return nodes, result, errors


def _expanded(
    r: Searcher,
    question: Question,
    result: TransformResult,
    guards: Guards,
    hits: Hits,
    pending: Any,
) -> Steps[tuple[TransformResult, list[NodeWithScore], Failures]]:
    """The gate, then the planned step: ``(result, nodes, errors)``. Whatever fails or
    overruns ``model_timeout`` after the LLM (the gate, embedding the generated text,
    searching with it, fusing) falls back to the question's own search (`fell_back`);
    a failure of the question's own search is raised."""
    step: plan.Step | None = None
    deadline = Deadline.start(r.model_timeout)  # for the models after the LLM
    try:
        expanded = result
        if plan.wants_gate(result, guards) and r._have_embedder("gate"):
            similarity = yield from _gate_similarity(r, question, result, deadline)
            top = yield from _top_similarity(r, question, hits, deadline)
            expanded = plan.gate_verdict(result, guards, similarity, top)
        step = planned(r, expanded, guards, hits)
        nodes, errors = yield from carry_out(r, step, question, hits, pending, deadline)
        return expanded, nodes, errors
    except GeneratorExit:  # a generator being closed must not yield again
        raise
    except BaseException as exc:
        # the question's own search still running is what the fallback returns: it
        # is cancelled only when this search ends here (cancelled, interrupted, or
        # the question's own search failed)
        error = yield Failed(exc, pending)
        if plan.question_alone(step, question.text):
            if pending is not None:
                yield Cancel(pending)
            raise
    result = fell_back(result, error)
    step = planned(r, result, guards, hits)
    nodes, errors = yield from carry_out(r, step, question, hits, pending, deadline)
    return result, nodes, errors


def planned(r: Searcher, result: TransformResult, guards: Guards, hits: Hits) -> plan.Step:
    """`plan.plan` for ``result``, warning once about a guard dropped for want of an
    embedding model."""
    decided = plan.plan(result, guards, hits, have_embedder=r.embedder is not None)
    if decided.missing_embedder:
        r._have_embedder(decided.missing_embedder)
    return decided.step


def carry_out(
    r: Searcher,
    step: plan.Step,
    question: Question,
    hits: Hits,
    pending: Any = None,
    deadline: Deadline | None = None,
) -> Steps[Carried]:
    """The nodes of ``step`` and the failed sub-searches of a fan-out (raises what
    fails; the caller falls back); the models it calls answer by ``deadline``."""
    if isinstance(step, plan.Rerank):
        assert hits is not None
        generated = yield from _embedder(r).embed_texts(step.passages, deadline)
        head = yield from r.doc_vectors.read(hits[:RERANK_CANDIDATES], deadline)
        return reranked(hits, head, generated, step), []
    if isinstance(step, plan.Feedback):
        assert hits is not None
        vectors = yield from r.doc_vectors.read(hits[: step.k], deadline)
        asked = yield from question_vector(r, question, deadline)
        bundle = feedback_bundle(question.text, asked, vectors, step)
        return unique_nodes((yield SearchGenerated(bundle, deadline))), []
    if isinstance(step, plan.Fanout):
        dense: list[Dense | None] = [None] * len(step.specs)
        if _dense(r):
            dense = yield from _vectors(r, step, question, deadline)
        bundles = _bundles(r, step, question, dense)
        searches = _searches(step, bundles, hits, question, deadline, pending)
        lists, weights, errors = split(step.specs, (yield searches))
        return _combine(r, lists, weights), errors
    return unique_nodes(hits or []), []


def question_vector(
    r: Searcher, question: Question, deadline: Deadline | None = None
) -> Steps[Vec]:
    """The question's vector: the caller's embedding, else the mean of the query
    embeddings of its embedding strings (as LlamaIndex's retrievers aggregate them),
    the embedder answering by ``deadline``."""
    if question.embedding is not None:
        return question.embedding
    embedder = _embedder(r)
    vectors = []
    for text in question.embedding_strs:
        vectors.append((yield from embedder.embed_query(text, deadline)))
    return mean(vectors)


def question_bundle(r: Searcher, question: Question) -> Steps[QueryBundle]:
    """The question's own search, with our vector of it for a dense retriever (one
    that cannot be searched with is left to the retriever to embed)."""
    if question.embedding is None and _dense(r):
        return question.bundle(searchable((yield from question_vector(r, question))))
    return question.bundle()


def _question_first(
    r: Searcher, question: Question, bundle: QueryBundle | None = None
) -> Steps[list[NodeWithScore]]:
    """The question's own hits, searched before anything else; what its search raised
    is raised, as a plain retriever would, once `Failed` has made it a failure (a
    stray ``CancelledError`` from a store's client is a `CallError`, never taken for
    the caller's own cancellation, which propagates as itself)."""
    hits = yield from question_hits(r, question, bundle)
    if isinstance(hits, Exception):
        raise hits
    return hits


def question_hits(
    r: Searcher, question: Question, bundle: QueryBundle | None = None
) -> Steps[list[NodeWithScore] | Exception]:
    """The question's own hits (of ``bundle``, else of the question's bundle), or what
    its search raised (returned, so that the caller decides once the transform is
    done: `_after_overlap`)."""
    try:
        if bundle is None:
            bundle = yield from question_bundle(r, question)
        hits: list[NodeWithScore] = yield SearchQuestion(bundle)
        return hits
    except GeneratorExit:  # a generator being closed must not yield again
        raise
    except BaseException as exc:
        failed: Exception = yield Failed(exc)
        return failed


def reranked_or_kept(
    r: Searcher, nodes: list[NodeWithScore], question: Question
) -> Steps[list[NodeWithScore]]:
    """``nodes`` through the ``reranker``; as they are, with a warning, when it fails
    (a reranker is one more component that never breaks search). A reranker gets
    fresh wrappers (`_copy`): its scores never touch the wrapped retriever's
    objects; without one the nodes are handed on as that retriever made them, as a
    plain retriever would (a copy was a fifth of a cache hit's cost)."""
    if r.reranker is None or not nodes:
        return nodes
    deadline = Deadline.start(r.model_timeout)  # its own: whatever came before
    given = _copy(nodes)  # what it scores; one that overran goes on with these alone
    try:
        return rerank_output((yield Rerank(given, question.bundle(), deadline)))
    except GeneratorExit:  # a generator being closed must not yield again
        raise
    except BaseException as exc:
        error = yield Failed(exc)
    logger.warning("the reranker failed (%s); returning the nodes as fused", describe(error))
    return nodes


def _gate_similarity(
    r: Searcher, question: Question, result: TransformResult, deadline: Deadline | None
) -> Steps[float]:
    """Cosine of the question's vector and the generated text's mean (the gate);
    `plan.UnusableVector` when a vector cannot be compared."""
    generated = yield from _embedder(r).embed_texts(result.hypothetical, deadline)
    return similarity((yield from question_vector(r, question, deadline)), generated)


def _top_similarity(
    r: Searcher, question: Question, hits: Hits, deadline: Deadline | None
) -> Steps[float | None]:
    """Cosine of the question's vector and its own top hit's stored vector (the
    relative gate's reference); None with no relative gate or no hit."""
    if r.transformer.guards.gate_relative is None or not hits:
        return None
    top = yield from r.doc_vectors.read(hits[:1], deadline)
    return similarity((yield from question_vector(r, question, deadline)), top)


def _vectors(
    r: Searcher, step: plan.Fanout, question: Question, deadline: Deadline | None
) -> Steps[list[Dense | None]]:
    """The embeddings each search of ``step`` needs (None: none, reused, or the
    plain question's when the embedder failed: see `_embedded`)."""
    vectors: list[Dense | None] = []
    for spec, reused in zip(step.specs, step.reuse):
        wanted = not reused and _wants_vector(r, spec, question.text)
        vectors.append((yield from _embedded(r, spec, question, deadline)) if wanted else None)
    return vectors


def _embedded(
    r: Searcher, spec: SearchSpec, question: Question, deadline: Deadline | None
) -> Steps[Dense | None]:
    """The question's query vector and the passages' document vectors for ``spec``
    (a sub-question of a chain is embedded as a query of its own), the embedder
    answering by ``deadline``. None for the plain question when the embedder fails
    or overruns: the wrapped retriever embeds it itself, as it would alone (so the
    fallback after a hung embedder does not wait on it again)."""
    if plan.is_question(spec, question.text):
        try:
            return (yield from question_vector(r, question, deadline)), []
        except GeneratorExit:  # a generator being closed must not yield again
            raise
        except BaseException as exc:
            error = yield Failed(exc)
        logger.warning(
            "embedding the question failed (%s); the retriever embeds it itself",
            describe(error),
        )
        return None
    asked = spec.query or question.text
    if asked == question.text:
        asked_vector = yield from question_vector(r, question, deadline)
    else:
        asked_vector = yield from _embedder(r).embed_query(asked, deadline)
    passages = []
    if spec.passages:
        passages = yield from _embedder(r).embed_texts(spec.passages, deadline)
    return asked_vector, passages


# -- what the steps compute (no I/O) ---------------------------------------------------
def _embedder(r: Searcher) -> EmbedSteps:
    assert r.embedder is not None  # the steps embed only when there is an embedder
    return r.embedder


def _searches(
    step: plan.Fanout,
    bundles: list[QueryBundle | None],
    hits: Hits,
    question: Question,
    deadline: Deadline | None,
    pending: Any,
) -> SearchAll:
    """The searches ``step`` runs (see `SearchAll`'s fields)."""
    todo = step.todo()
    of_question = frozenset(i for i in todo if plan.is_question(step.specs[i], question.text))
    in_place = todo[0] if len(todo) == 1 and pending is None else None
    outcomes: list[Any] = [hits] * len(step.specs)
    return SearchAll(step.specs, bundles, deadline, pending, todo, of_question, outcomes, in_place)


def method_of(transformer: QueryTransformer) -> str:
    """The name a result of ``transformer`` carries."""
    return transformer.method or type(transformer).__name__


def _reused(transformed: TransformResult | None) -> TransformResult | None:
    """A rewrite made earlier, as this search reports it: its calls were reported by
    the step that made them, so zero ``usage`` here (theirs in ``generation_usage``)."""
    if transformed is None:
        return None
    spent = transformed.generation_usage or transformed.usage
    return revised(transformed, usage=Usage(), generation_usage=spent)


def _after_overlap(hits: Hits, searching: Any, found: Any, guards: Guards) -> tuple[Hits, Any]:
    """``(hits, pending)`` once the transform is done, ``searching`` being the
    question's own search started while the LLM wrote (or None): a guard that needs
    its hits takes what it ``found``, and raises what that search raised (the
    question's own search failed, as a plain retriever's would); a fan-out goes on
    with the search still running, ``pending``, joined with its other searches."""
    if searching is None:
        return hits, None
    if guards.needs_question_hits:
        if isinstance(found, BaseException):
            raise found
        return found, None
    return [], searching


def _dense(r: Searcher) -> bool:
    return r.embedder is not None and r.search_type != "keyword"


def _wants_vector(r: Searcher, spec: SearchSpec, query: str) -> bool:
    """Whether ``spec`` is searched with a vector we embed (weighted passages, or
    the question itself) rather than the retriever's own embedding of its strings
    (a core transform's ``custom_embedding_strs``, a paraphrase)."""
    return _dense(r) and bool(spec.passages or plan.is_question(spec, query))


def _bundles(
    r: Searcher, step: plan.Fanout, question: Question, vectors: list[Dense | None]
) -> list[QueryBundle | None]:
    """One bundle per search of ``step`` (None for a reused one); the question's
    own search carries what the caller gave for it (`Question.bundle`). Raises
    `plan.UnusableVector` when a generated vector cannot be searched with."""
    bundles: list[QueryBundle | None] = []
    for spec, reused, dense in zip(step.specs, step.reuse, vectors):
        if reused:
            bundles.append(None)
        elif plan.is_question(spec, question.text):  # our vector only if usable
            bundles.append(question.bundle(searchable(dense[0]) if dense else None))
        elif spec.embedding is not None:  # a core transform's own vector, as given
            vector = list(spec.embedding)
            plan.check_vectors([vector], "transformed")
            bundles.append(QueryBundle(query_str=spec.text, embedding=vector))
        elif dense is None:
            strs = list(spec.embedding_strs)
            text = _query_str(r, spec)
            bundles.append(QueryBundle(query_str=text, custom_embedding_strs=strs))
        else:
            bundles.append(dense_bundle(_query_str(r, spec), spec, dense))
    return bundles


def _query_str(r: Searcher, spec: SearchSpec) -> str:
    """The ``query_str`` of the search ``spec``: its text (the passages, the
    question repeated to its weight) for a keyword or hybrid retriever, which
    matches it; for a dense one the question it asks (``spec.query`` beside
    passages), as core's HyDE sends it, the generated text going only to the
    embedding (``custom_embedding_strs`` or our vector)."""
    if r.search_type in ("keyword", "hybrid"):
        return spec.text
    return spec.query if spec.passages and spec.query else spec.text


def split(
    specs: Sequence[SearchSpec], outcomes: list[Any]
) -> tuple[list[list[NodeWithScore]], list[float], Failures]:
    """A fan-out's ``outcomes`` as the ranked lists, their fusion weights and the
    failed searches (logged); what the first failure raised when every search failed."""
    lists: list[list[NodeWithScore]] = []
    weights: list[float] = []
    errors: Failures = []
    first_error: Exception | None = None
    for i, (spec, outcome) in enumerate(zip(specs, outcomes)):
        if isinstance(outcome, Exception):
            logger.warning(
                "sub-search %r failed (%s); using the other searches",
                spec.text[:80],
                describe(outcome),
            )
            errors.append((i, describe(outcome)))
            first_error = first_error or outcome
        else:
            lists.append(list(outcome))
            weights.append(spec.weight)
    if not lists and first_error is not None:
        raise first_error
    return lists, weights, errors


def _combine(
    r: Searcher, lists: list[list[NodeWithScore]], weights: list[float]
) -> list[NodeWithScore]:
    if len(lists) == 1:  # copied only for a reranker (`reranked_or_kept`)
        return unique_nodes(lists[0])
    mode = fusion_mode(r.fusion or r.transformer.default_fusion, weights)
    return fuse(lists, mode, weights=weights, k=r.transformer.rrf_k)


def scoring(r: Searcher, result: TransformResult, failed: Sequence[int] = ()) -> str | None:
    """What the scores of a search that ``result`` shaped are, in one line, when
    `_combine` fused several ranked lists (`fusion.explain`: the mode, its ``k``, the
    lists' weights); None when the scores are one list's own (the store's, a rerank's
    blend, a reranker's). The searches are those `plan.plan` chooses for ``result``,
    less the ``failed`` ones (their positions among them)."""
    guards = r.transformer.guards
    hits: Hits = [] if guards.needs_question_hits or plan.question_first(guards) else None
    step = plan.plan(result, guards, hits, have_embedder=r.embedder is not None).step
    if r.reranker is not None or not isinstance(step, plan.Fanout):
        return None
    kept = [(i, spec) for i, spec in enumerate(step.specs) if i not in failed]
    weights = [spec.weight for _, spec in kept if spec.weight > 0]
    if len(weights) < 2:
        return None
    mode = fusion_mode(r.fusion or r.transformer.default_fusion, weights)
    first, spec = kept[0]
    own = first == 0 and result.include_query and plan.is_question(spec, result.query)
    return explain(mode, weights, r.transformer.rrf_k, "question" if own else "first")


def _copy(nodes: Sequence[NodeWithScore]) -> list[NodeWithScore]:
    """Fresh NodeWithScore wrappers (deduplicated by node id), so that a reranker's
    scoring never touches the wrapped retriever's objects. A shallow ``model_copy``:
    half the cost of building one."""
    return [item.model_copy() for item in unique_nodes(nodes)]


def rerank_output(out: object) -> list[NodeWithScore]:
    """A reranker's answer, checked: a list of ``NodeWithScore`` whose scores are None or
    finite real numbers (numpy's too). Anything else (None, a string, a list of texts, a
    NaN score) is a ``TypeError`` / ``ValueError``: a failed reranker, whose fused
    nodes are kept."""
    if not isinstance(out, list):
        raise TypeError(f"the reranker returned {type(out).__name__}, not a list of NodeWithScore")
    for item in out:
        if not isinstance(item, NodeWithScore):
            kind = type(item).__name__
            raise TypeError(f"the reranker returned a list holding {kind}, not NodeWithScore")
        score = item.score
        if score is not None and not (isinstance(score, numbers.Real) and math.isfinite(score)):
            raise ValueError(f"the reranker returned the score {score!r}, not a finite number")
    return out


def fell_back(result: TransformResult, exc: Exception) -> TransformResult:
    """The one place where a failure after the LLM (embedding the generated text,
    searching with it, fusing) becomes the question's own search: ``result`` as a
    fallback saying why (`plan.degraded`). Only failures come here (`Failed`):
    cancellation and interrupts propagate."""
    reason = str(exc) if isinstance(exc, plan.UnusableVector) else describe(exc)
    logger.warning(
        "searching with the %s output failed (%s); searching with the question alone",
        result.method,
        reason,
    )
    return plan.degraded(result, reason)


def mean(vectors: Sequence[Vec]) -> Vec:
    """The element-wise mean of ``vectors`` (one vector: itself)."""
    if len(vectors) == 1:
        return vectors[0]
    return [sum(column) / len(vectors) for column in zip(*vectors)]


def searchable(vector: Vec) -> Vec | None:
    """``vector``, or None when it cannot be searched with (empty, NaN, infinite or all
    zeros): the wrapped retriever then embeds the question itself."""
    try:
        plan.check_vectors([vector], "question")
    except plan.UnusableVector:
        return None
    return vector


def similarity(question: Vec, generated: list[Vec]) -> float:
    """The cosine of the ``question``'s vector and the mean of the ``generated``
    text's vectors (`plan.UnusableVector` when one cannot be used)."""
    plan.check_vectors([question, *generated], "question or passage", len(question))
    return expansion.cosine(question, expansion.mean_unit(generated))


def dense_bundle(query_str: str, spec: SearchSpec, dense: Dense) -> QueryBundle:
    """The bundle of a search with our own vector: the weighted mix of the question and
    the passages, or the query's own vector when there are none. `plan.UnusableVector`
    when a vector is empty, of another size than the question's, NaN or infinite."""
    question, passages = dense
    if not passages:  # a sub-question of a chain, embedded as a query of its own
        return QueryBundle(query_str=query_str, embedding=searchable(question))
    plan.check_vectors([question, *passages], "question or passage", len(question))
    vector = expansion.weighted_vector(question, passages, spec.query_weight)
    plan.check_vectors([vector], "weighted search")
    return QueryBundle(query_str=query_str, embedding=vector)


def feedback_bundle(
    query: str, question: Vec, doc_vectors: list[Vec], step: plan.Feedback
) -> QueryBundle:
    """The Rocchio search's bundle (`plan.UnusableVector` when a vector cannot be used:
    the caller keeps the question's own hits)."""
    plan.check_vectors([question, *doc_vectors], "question or document", len(question))
    vector = expansion.rocchio_vector(question, doc_vectors, step.alpha, step.beta)
    plan.check_vectors([vector], "feedback")
    return QueryBundle(query_str=query, embedding=vector)


def reranked(
    hits: list[NodeWithScore],
    doc_vectors: list[Vec],
    generated: list[Vec],
    step: plan.Rerank,
) -> list[NodeWithScore]:
    """The first `RERANK_CANDIDATES` of ``hits`` (``doc_vectors`` are theirs) reordered
    by the blend (see `_blend`), then the rest in the order found, scored below them;
    `plan.UnusableVector` when a passage or document vector cannot be used (the caller
    keeps ``hits`` as found)."""
    plan.check_vectors([*doc_vectors, *generated], "document or passage")
    head = _blend(hits[:RERANK_CANDIDATES], doc_vectors, expansion.mean_unit(generated), step.blend)
    seen = {item.node.node_id for item in head}
    rest = unique_nodes([x for x in hits[RERANK_CANDIDATES:] if x.node.node_id not in seen])
    floor = min((float(item.score or 0.0) for item in head), default=0.0)
    return [*head, *(scored(item.node, floor - 1e-6 * (i + 1)) for i, item in enumerate(rest))]


def _blend(
    hits: list[NodeWithScore],
    doc_vectors: list[list[float]],
    generated: Any,
    blend: float,
) -> list[NodeWithScore]:
    """``hits`` reordered by the blend of their own score and their similarity to the
    generated text (see `expansion.blend_scores`); the same nodes, new wrappers."""
    unique = unique_nodes(hits)
    if len(unique) != len(hits):
        keep = {id(item) for item in unique}
        doc_vectors = [v for item, v in zip(hits, doc_vectors) if id(item) in keep]
    sims = [expansion.cosine(v, generated) for v in doc_vectors]
    scores = expansion.blend_scores([float(h.score or 0.0) for h in unique], sims, blend)
    order = expansion.best_first(scores)
    return [scored(unique[i].node, scores[i]) for i in order]
