"""Shared constructor and parsing for the transforms whose reply is a list of queries."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from llama_index.core.llms import LLM

from .._checks import check_int, is_number
from ..usage import Usage
from .base import MAX_N, TransformResult, logger
from .llm_base import LLMTransform, UnusableReplyError
from .options import LLMOptions
from .parsing import (
    MAX_QUERY_CHARACTERS,
    ReadOptions,
    ReadQueries,
    parse_single,
    read_queries,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["MAX_N", "QueryListTransform"]


class QueryListTransform(LLMTransform):
    """An LLM transform whose reply parses to at most ``n`` search queries, each at most
    ``max_characters`` long (trimmed at a sentence end, else a word break)."""

    prompt_vars: ClassVar[frozenset[str]] = frozenset({"query", "n"})
    SEARCH_OPTIONS: ClassVar[frozenset[str]] = frozenset(
        {"include_query", "original_weight", "rrf_k"}
    )
    """Whether and how heavily the question's own list is fused: not in the cache key
    (``n`` and ``max_characters`` are: they change what is parsed from the reply)."""
    parse_excludes_query: ClassVar[bool] = True
    """Whether a generated query equal to the question is dropped while parsing (so it
    does not take one of the ``n`` places). Part of the cache key."""
    SHIPPED_ORIGINAL_WEIGHT: ClassVar[dict[str, float]] = {"small": 1.0, "capable": 1.0}
    """Fusion weight of the question's own list when nothing is said, by generator
    (`LLMTransform.generator`), chosen on SciFact train (BENCHMARKS.md). ``"small"``,
    the bundled SmolLM2-135M: 100 (multi-query, decompose) or 50 (step-back, rewrite),
    close to a no-op on purpose (its queries only break near-ties; at lower weights
    they cost 1 to 11 nDCG@10 points). ``"capable"``, any other LLM: 5 (multi-query,
    step-back, rewrite) or 3 (decompose, two or more sub-queries), with RRF k 10
    (`SHIPPED_RRF_K`), chosen on SciFact train with the strong-generator stand-in (its
    query a relevant document's title; decompose's two titles): they keep 66% and 87%
    of what weight 1 gains when the model is right and gain +1.1 and +1.2 when half
    its queries are plausible but wrong (weight 1 there: -13 nDCG@10). Weigh your own
    with ``hyde-plus tune``."""

    SHIPPED_RRF_K: ClassVar[dict[str, int]] = {"small": 60, "capable": 10}
    """RRF's ``k`` when nothing is said, by generator: 10 for a capable model (its
    queries' top hits count at a moderate question weight; chosen with the stand-in on
    SciFact train, BENCHMARKS.md), the usual 60 for the bundled model."""

    DEFAULT_N: ClassVar[int | None] = None
    """``n`` when none is given; None for a transform that writes exactly one query
    and takes no ``n`` (StepBack, Rewrite)."""

    def __init__(
        self,
        llm: LLM | None = None,
        *,
        n: int | None = None,
        include_query: bool = True,
        original_weight: float | None = None,
        rrf_k: int | None = None,
        max_characters: int = MAX_QUERY_CHARACTERS,
        **options: Unpack[LLMOptions],
    ) -> None:
        if n is not None and self.DEFAULT_N is None:
            raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument 'n'")
        n = (self.DEFAULT_N or 1) if n is None else n
        check_int(n, "n", 1, MAX_N)
        check_int(max_characters, "max_characters", 1, None)
        super().__init__(llm, **options)
        if not isinstance(include_query, bool):
            raise TypeError("include_query must be True or False")
        if not include_query and original_weight is not None:
            raise ValueError("original_weight weighs the question's list: it needs include_query")
        self.n = n
        self.include_query = include_query
        self.max_characters = max_characters
        if original_weight is not None:
            if not is_number(original_weight):
                raise TypeError("original_weight must be a number >= 0")
            if not 0 <= original_weight <= 100:
                raise ValueError("original_weight must be between 0 and 100")
            original_weight = float(original_weight)
        self._original_weight = original_weight
        if rrf_k is not None:
            check_int(rrf_k, "rrf_k", 1, 1000)
        self._rrf_k = rrf_k
        self._rendered_instruction: tuple[object, int, str] | None = None

    @property
    def original_weight(self) -> float:
        """The fusion weight of the question's own list: the one given, else the
        shipped one for this transform's generator (`SHIPPED_ORIGINAL_WEIGHT`)."""
        if self._original_weight is not None:
            return self._original_weight
        return self.SHIPPED_ORIGINAL_WEIGHT[self.generator]

    @property
    def rrf_k(self) -> int:  # type: ignore[override]
        """RRF's ``k`` for this transform's lists: the one given, else the shipped one
        for its generator (`SHIPPED_RRF_K`)."""
        if self._rrf_k is not None:
            return self._rrf_k
        return self.SHIPPED_RRF_K[self.generator]

    def _search_fields(self) -> dict[str, Any]:
        """How the queries are searched, as `TransformResult` fields."""
        shipped = self.include_query and self._original_weight is None
        return {
            "include_query": self.include_query,
            "original_weight": self.original_weight,
            "defaults": self.generator if shipped else None,
        }

    def _params(self) -> dict[str, Any]:
        # the options, and the parse rule of the class (a query equal to the question
        # dropped or kept): both change the parsed queries; a class that writes one
        # query refuses ``n``, so ``n`` is no option of it
        params = {**super()._params(), "parse_excludes_query": self.parse_excludes_query}
        if self.DEFAULT_N is None:
            params.pop("n", None)
        return params

    def _with_search_options(self, result: TransformResult, **changes: Any) -> TransformResult:
        # max_characters is in the key: a query trimmed for a smaller limit cannot be
        # served to a larger one, so a hit is served as parsed
        return replace(result, **{**self._search_fields(), **changes})

    def _format_vars(self) -> dict[str, Any]:
        return {"n": self.n} if "n" in self._prompt.template_vars else {}

    def _parse(self, reply: str, query: str, exclude: tuple[str, ...]) -> ReadQueries:
        """The queries of ``reply`` and what became of the rest of it: a list for
        ``n``-query transforms (`read_queries`), the first question-like line for
        single-query ones (`parse_single`; the count is the list reading's, which
        holds the same items). Lines that echo this transform's prompt (rendered
        without the question) are dropped."""
        options: ReadOptions = {
            "exclude": exclude,
            "max_characters": self.max_characters,
            "instruction": self._instruction(),
            "question": query,
        }
        read = read_queries(reply, self.n, **options)
        if self.DEFAULT_N is None:
            return ReadQueries(tuple(parse_single(reply, **options)), read.count)
        return read

    def _instruction(self) -> str:
        """The prompt rendered without the question (what an echo repeats), rendered
        once per prompt and ``n`` rather than once per reply."""
        prompt, n = self._prompt, self.n
        known = self._rendered_instruction
        if known is None or known[0] is not prompt or known[1] != n:
            known = (prompt, n, self._render(""))
            self._rendered_instruction = known
        return known[2]

    def _build(self, query: str, replies: list[str], usage: Usage) -> TransformResult:
        """The queries of the reply; an `UnusableReplyError` saying why when it holds
        none, the question itself excepted where the class drops it
        (`parse_excludes_query`): the question is then searched alone, as for any
        reply with nothing to use, and the result is a fallback that says so. A list
        transform's result carries the count of its reply (`QueryCount`), and one
        that kept fewer queries than asked for is logged (at INFO) with the reasons."""
        exclude = (query,) if self.parse_excludes_query else ()
        read = self._parse(replies[0], query, exclude)
        listed = self.DEFAULT_N is not None
        if not read.queries:
            raise UnusableReplyError(
                f"no query could be parsed from the reply ({read.count.reasons()})",
                count=read.count if listed else None,
            )
        if listed and read.count.short:
            logger.info("%s %s", self.method, read.count.summary())
        return TransformResult(
            query=query,
            method=self.method,
            queries=read.queries,
            usage=usage,
            parsed=read.count if listed else None,
            **self._search_fields(),
        )
