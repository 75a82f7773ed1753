"""`HyDE`: search with hypothetical documents instead of the question."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from llama_index.core.llms import LLM

from .._attrs import optional_attr
from .._checks import check_int, is_int
from ..calls.llm import CallOptions
from ..search.expansion import check_weight, keyword_query
from ..usage import Usage
from .base import Guards, SearchSpec, Strategy, TransformResult, check_strategy, revised
from .llm_base import LLMTransform, UnusableReplyError
from .options import LLMOptions
from .parsing import dedupe, reply_past, trim_passage
from .prompts import GROUNDING_PREFIX, HYDE_PROMPT

if TYPE_CHECKING:
    from typing_extensions import Unpack

_ECHO = re.compile(
    r"^\s*(?:passage|hypothetical (?:document|passage)|document|answer)\s*:\s*", re.IGNORECASE
)


class _Unset:
    """The type of `UNSET`: an option left to the shipped default."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


@dataclass(frozen=True)
class Shipped:
    """One set of HyDE's shipped search options (see `HyDE.SHIPPED`)."""

    query_weight: float
    gate: float | None
    strategy: Strategy = "replace"
    gate_relative: float | None = None


class HyDE(LLMTransform):
    """Hypothetical Document Embeddings (Gao et al., 2022), with quality guards.

    An LLM writes ``num_passages`` passages that answer the question; each is trimmed
    to ``max_characters`` at a sentence end (else a word break).

    How the passages are searched:

    - ``query_weight`` (0..1): the question's share of the dense search vector,
      ``unit(w * e(question) + (1 - w) * mean(e(passage)))``. 0 searches with the
      passages alone; the paper's plain mean of N passages and the question is
      ``1 / (N + 1)``, which ``include_query=True`` (without ``query_weight``) selects;
      ``include_query=False`` means 0.
    - ``keyword_weight`` (0..1): the question's share of the text a keyword or hybrid
      store matches; the question is repeated (Query2doc / MuGI) so BM25 is not swamped
      by the passage. Defaults to ``query_weight`` when that is set. Setting
      ``query_weight=1`` with a lower ``keyword_weight`` is hybrid routing: the dense
      side keeps the question, the generated text goes to BM25 only.
    - ``strategy="rerank"``: do not replace the question's search; reorder its own
      candidates by ``(1 - blend) * score + blend * similarity to the passages``.
      Recall at the candidate depth is then exactly plain search's.
    - ``gate``: when the passages' mean embedding has a cosine similarity to the
      question below ``gate``, the expansion is skipped for that query
      (``result.skipped`` says why; it is not a failure). ``None`` turns it off.
    - ``gate_relative=d``: skip it when that cosine is more than ``d`` below the
      question's cosine to its own top hit (the question is searched while the LLM
      writes, and a skipped query reuses those hits). It follows how well the question
      itself is matched, where ``gate`` is one threshold for every question.
    - ``grounded=k``: the question's top ``k`` hits (each cut to
      ``context_characters``) are put in the prompt, so the model writes from the
      corpus instead of from memory. One extra search; cached like any generation.

    With neither ``include_query`` nor ``query_weight``, the shipped defaults for the
    transform's generator apply (`SHIPPED`: question weight 0.8 and a 0.7 gate for the
    bundled SmolLM2-135M, question weight 0.7 and no gate for any other LLM; chosen on
    SciFact train, BENCHMARKS.md) and ``result.defaults`` names the set; choosing the
    vector or the strategy yourself turns the default gate off. The guards that need
    embeddings or the question's hits (weights, rerank, gate, grounding) are carried out
    by `TransformRetriever`; `run()` (LlamaIndex's ``TransformQueryEngine``)
    approximates the weight by repeating the question.
    ``num_passages`` (1..16) passages are written per question (concurrently on the
    async path; one after another on the sync path); ``max_characters`` trims each.
    ``prompt``, ``temperature``, ``timeout``, ``prices``, ``callback_manager``,
    ``cache``, ``retry`` and ``breaker`` are the `LLMOptions` every built-in transform
    takes. Prompt key: ``"hyde_prompt"``.
    """

    method: ClassVar[str] = "hyde"
    default_prompt: ClassVar[str] = HYDE_PROMPT
    SHIPPED: ClassVar[dict[str, Shipped]] = {
        "small": Shipped(query_weight=0.8, gate=0.7),
        "capable": Shipped(query_weight=0.7, gate=None),
    }
    """The defaults by generator (`LLMTransform.generator`), chosen on SciFact train
    (BENCHMARKS.md). ``"small"``, the bundled SmolLM2-135M, whose passages
    rarely help: the question keeps 0.8 of the vector and a 0.7 cosine gate skips
    passages far from the question. ``"capable"``, any other LLM, measured with the
    strong-generator stand-in (``--llm oracle:P``): question weight 0.7 and no gate
    keeps most of what good passages gain and loses little when half are wrong."""
    SEARCH_OPTIONS: ClassVar[frozenset[str]] = frozenset(
        {
            "include_query",
            "query_weight",
            "keyword_weight",
            "strategy",
            "blend",
            "gate",
            "gate_relative",
            "grounded",
            "context_characters",
        }
    )
    """Options that decide how the passages are searched, not the passages: out of the
    cache key. ``grounded`` and ``context_characters`` choose the question's hits the
    prompt shows; those passages themselves are in the key (``context``)."""
    DEFAULT_BLEND: ClassVar[float] = 0.3
    """The rerank blend when ``strategy="rerank"`` is asked for without one."""
    CHARACTERS_PER_TOKEN: ClassVar[int] = 4
    """English text averages about 4 characters per token: a passage of
    ``max_characters`` needs at most ``max_characters / 4`` tokens (`max_tokens`)."""

    def __init__(
        self,
        llm: LLM | None = None,
        *,
        max_characters: int = 2000,
        include_query: bool | None = None,
        query_weight: float | None = None,
        keyword_weight: float | None = None,
        num_passages: int = 1,
        strategy: Strategy | None = None,
        blend: float | None = None,
        gate: float | _Unset | None = UNSET,
        gate_relative: float | _Unset | None = UNSET,
        grounded: int = 0,
        context_characters: int = 400,
        **options: Unpack[LLMOptions],
    ) -> None:
        check_int(max_characters, "max_characters", 1, None)
        check_int(num_passages, "num_passages", 1, 16)
        check_int(grounded, "grounded", 0, 20)
        check_int(context_characters, "context_characters", 1, None)
        if strategy is not None:
            check_strategy(strategy)
        if blend is not None and strategy != "rerank":
            raise ValueError("blend only applies with strategy='rerank'; add it or drop blend")
        super().__init__(llm, **options)
        self.max_characters = max_characters
        self.num_passages = num_passages
        self.context_characters = context_characters
        # the weight is shipped unless the caller chose the vector; the strategy and
        # gate only when the caller chose none of the vector, the strategy or the gate
        self._shipped = include_query is None and query_weight is None
        self._shipped_guards = self._shipped and strategy is None
        self._query_weight, self._include_query = _resolve_weight(query_weight, include_query)
        self._keyword_weight = check_weight(keyword_weight, "keyword_weight")
        self._gate = gate
        self._gate_relative = gate_relative
        self._fixed: Guards | None = None
        self._shipped_by_generator: dict[str, Guards] = {}
        self._last_styled: tuple[TransformResult, tuple[Any, ...], TransformResult] | None = None
        # checked now; the generator's shipped strategy and gate fill what is unset
        self._options = Guards(
            context_k=grounded,
            strategy=strategy or "replace",
            blend=self.DEFAULT_BLEND if blend is None else blend,
            gate=None if isinstance(gate, _Unset) else gate,
            gate_relative=None if isinstance(gate_relative, _Unset) else gate_relative,
        )

    @property
    def defaults(self) -> Shipped | None:
        """The shipped defaults in force (for this transform's generator), or None when
        the caller chose the vector (``query_weight`` or ``include_query``)."""
        return self.SHIPPED[self.generator] if self._shipped else None

    def _weights(self) -> tuple[bool, float | None, float | None, Shipped | None]:
        """``(include_query, query_weight, keyword_weight, defaults)`` in force, the
        shipped defaults looked up once."""
        shipped = self.defaults
        if shipped is not None:
            query_weight: float | None = shipped.query_weight
            include = shipped.query_weight > 0
        else:
            query_weight, include = self._query_weight, self._include_query
        keyword = self._keyword_weight if self._keyword_weight is not None else query_weight
        return include, query_weight, keyword, shipped

    @property
    def query_weight(self) -> float | None:
        """The question's share of the dense vector (None: the paper's plain mean)."""
        return self._weights()[1]

    @property
    def include_query(self) -> bool:  # type: ignore[override]
        return self._weights()[0]

    @property
    def searches_question(self) -> bool:
        """False: HyDE's one search mixes the passages into the question's vector, so
        the question is never searched on its own (its guards say when its hits are
        needed: rerank, feedback)."""
        return False

    @property
    def keyword_weight(self) -> float | None:
        """The question's share of the keyword text; the dense weight when unset."""
        return self._weights()[2]

    @property
    def guards(self) -> Guards:  # type: ignore[override]
        """What `TransformRetriever` carries out: the options given, with the
        generator's shipped strategy and gate where they were left unset."""
        if self._fixed is not None:
            return self._fixed
        if not self._shipped_guards:
            return self._options
        generator = self.generator
        guards = self._shipped_by_generator.get(generator)
        if guards is None:  # one per generator: the search path reads this every query
            shipped = self.SHIPPED[generator]
            gate = shipped.gate if isinstance(self._gate, _Unset) else self._gate
            relative = self._gate_relative
            if isinstance(relative, _Unset):
                relative = shipped.gate_relative
            guards = replace(
                self._options, strategy=shipped.strategy, gate=gate, gate_relative=relative
            )
            self._shipped_by_generator[generator] = guards
        return guards

    def chain_stage(self) -> HyDE:
        """This transform as the second stage of ``a.then(self)``: a chain searches
        every sub-question with its own vector, so the guards that act on one
        question's own search (rerank, gate, grounding) cannot apply. Defaults are
        dropped (the query weight stays); options you asked for are a `ValueError`."""
        self._options.check_chainable(type(self).__name__)  # what was asked, not shipped
        stage = copy.copy(self)
        stage._fixed = Guards()
        return stage

    def search_advice(self, search_type: str) -> str | None:
        if self.include_query or search_type not in ("keyword", "hybrid"):
            return None
        return (
            f"HyDE has include_query=False but the retriever uses {search_type} search: "
            "keyword matching will see only the generated passage, not the user's words. "
            "Use HyDE(include_query=True) for keyword and hybrid search."
        )

    @property
    def grounded(self) -> int:
        """How many of the question's hits the prompt shows (0: free generation)."""
        return self._options.context_k

    def _num_calls(self) -> int:
        return self.num_passages

    @property
    def max_tokens(self) -> int:
        """Tokens a passage may take: what ``max_characters`` can keep, so nothing is
        generated only to be trimmed away."""
        return max(1, -(-self.max_characters // self.CHARACTERS_PER_TOKEN))

    def _reply_tokens(self) -> int | None:
        return self.max_tokens

    def _call_options(self, **extra: Any) -> CallOptions:
        own = optional_attr(self.llm, "max_tokens")
        if not (is_int(own) and 0 < own <= self.max_tokens):
            extra["max_tokens"] = self.max_tokens  # below the model's cap
        enough = functools.partial(reply_past, self.max_characters, label=_ECHO)
        return super()._call_options(enough=enough, **extra)

    def _context(self, context: Sequence[str] | None) -> tuple[str, ...] | None:
        if not self.grounded or not context:
            return None
        cut = (trim_passage(" ".join(c.split()), self.context_characters) for c in context)
        return tuple(c for c in cut if c)[: self.grounded] or None

    def _render(self, query: str, context: Sequence[str] | None = None) -> str:
        prompt = super()._render(query, context)
        if not context:
            return prompt
        block = "\n".join(f"[{i}] {text}" for i, text in enumerate(context, 1))
        return GROUNDING_PREFIX.format(context=block) + prompt

    def _with_search_options(self, result: TransformResult, **changes: Any) -> TransformResult:
        """``result`` (a cache hit) `_styled`, with ``changes`` (which never touch
        what styling reads or sets). The styled form of the last hit is kept while the
        options it was styled with hold: an in-process cache serves the same result
        object every time, and rebuilding its search was a fifth of a hit's cost."""
        weights = self._weights()
        options = (*weights[:3], weights[3] is not None, self.generator)
        last = self._last_styled
        if last is not None and last[0] is result and last[1] == options:
            return revised(last[2], **changes)
        styled = self._styled(result, weights)
        self._last_styled = (result, options, styled)
        return revised(styled, **changes)

    def _styled(
        self, result: TransformResult, weights: tuple[Any, ...] | None = None
    ) -> TransformResult:
        """``result`` searched with this instance's options (``weights``: `_weights`,
        read again when not given): the question's weights in the one search
        (`SearchSpec`), reported in ``search_options``."""
        include, query_weight, keyword_weight, shipped = weights or self._weights()
        spec = passage_search(
            result.query, result.hypothetical, include, query_weight, keyword_weight
        )
        reported = {"query_weight": query_weight, "keyword_weight": keyword_weight}
        return revised(
            result,
            include_query=include,
            specs=(spec,) if spec is not None else (),
            search_options={k: v for k, v in reported.items() if v is not None},
            defaults=self.generator if shipped is not None else None,
        )

    def _build(self, query: str, replies: list[str], usage: Usage) -> TransformResult:
        passages = [trim_passage(_ECHO.sub("", r), self.max_characters) for r in replies]
        passages = [p for p in passages if p]
        if not passages:
            raise UnusableReplyError("the LLM returned an empty passage")
        if len(passages) > 1 and len(dedupe(passages)) < len(passages):
            # identical samples add nothing to the mean; keep the weight honest
            passages = dedupe(passages)
        return self._styled(
            TransformResult(
                query=query,
                method=self.method,
                queries=(),
                hypothetical=tuple(passages),
                usage=usage,
            )
        )


def passage_search(
    query: str,
    passages: tuple[str, ...],
    include_query: bool,
    query_weight: float | None,
    keyword_weight: float | None,
) -> SearchSpec | None:
    """The one search for HyDE's ``passages``: the dense vector gives the question
    ``query_weight`` of the mean, the keyword text repeats it to ``keyword_weight``.
    None when both are unset: the result's own plain mean (`TransformResult.searches`)."""
    if not passages or (query_weight is None and keyword_weight is None):
        return None
    head = (query,) if include_query else ()
    if query_weight is None:
        dense = len(head) / (len(passages) + len(head))
        strs: tuple[str, ...] = (*passages, *head)
    else:
        dense = query_weight
        strs = _embedding_strs(query, passages, query_weight)
    if keyword_weight is None:
        text = "\n\n".join(head + passages)
    else:
        text = keyword_query(query, passages, keyword_weight)
    return SearchSpec(text, strs, passages=passages, query=query, query_weight=dense)


def _embedding_strs(query: str, passages: tuple[str, ...], weight: float) -> tuple[str, ...]:
    """Strings whose plain mean approximates the weighted vector, for a search with no
    embedder at hand (LlamaIndex averages ``custom_embedding_strs`` equally): the
    question repeated so its share of the mean is close to ``weight``."""
    if weight <= 0:
        return passages
    if weight >= 1:
        return (query,)
    n = len(passages)
    repeats = max(1, min(n * 8, round(weight * n / (1 - weight))))
    return (*passages, *([query] * repeats))


def _resolve_weight(
    query_weight: float | None, include_query: bool | None
) -> tuple[float | None, bool]:
    """``(query_weight, include_query)`` from what the caller said: an explicit weight
    wins (and must agree with ``include_query``); ``include_query`` alone means the
    paper's plain mean (True) or passages only (False). Neither: the shipped defaults
    decide later (``(None, True)`` until then)."""
    if include_query is not None and not isinstance(include_query, bool):
        raise TypeError("include_query must be True, False or None")
    if query_weight is not None:
        w = check_weight(query_weight, "query_weight")
        assert w is not None
        if include_query is False and w > 0:
            raise ValueError("include_query=False contradicts query_weight > 0; drop one")
        if include_query is True and w == 0:
            raise ValueError("include_query=True contradicts query_weight=0; drop one")
        return w, w > 0
    return None, include_query is not False
