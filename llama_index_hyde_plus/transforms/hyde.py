"""`HyDE`: search with hypothetical documents instead of the question."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from llama_index.core.llms import LLM

from ..expansion import check_weight
from ..usage import Usage
from .base import Guards, Strategy, TransformResult, check_int
from .llm_base import LLMTransform, UnusableReplyError
from .options import LLMOptions
from .parsing import dedupe, trim_passage
from .prompts import GROUNDING_PREFIX, HYDE_PAPER_PROMPTS, HYDE_PROMPT

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
    - ``grounded=k``: the question's top ``k`` hits (each cut to
      ``context_characters``) are put in the prompt, so the model writes from the
      corpus instead of from memory. One extra search; cached like any generation.

    With neither ``include_query`` nor ``query_weight``, the shipped defaults apply
    (`DEFAULT_QUERY_WEIGHT` 0.8 and `DEFAULT_GATE` 0.7, chosen by ``hyde-plus tune``
    on SciFact train; BENCHMARKS.md); choosing the vector yourself turns the default
    gate off. The guards that need embeddings or the question's hits (weights, rerank, gate,
    grounding) are carried out by `TransformRetriever`; `run()` (LlamaIndex's
    ``TransformQueryEngine``) approximates the weight by repeating the question.
    ``num_passages`` (1..16) passages are written per question (concurrently on the
    async path; one after another on the sync path); ``max_characters`` trims each.
    ``prompt``, ``temperature``, ``timeout``, ``prices``, ``callback_manager``,
    ``cache``, ``retry`` and ``breaker`` are the `LLMOptions` every built-in transform
    takes. Prompt key: ``"hyde_prompt"``.
    """

    method: ClassVar[str] = "hyde"
    prompt_key: ClassVar[str] = "hyde_prompt"
    default_prompt: ClassVar[str] = HYDE_PROMPT
    DEFAULT_STRATEGY: ClassVar[Strategy] = "replace"
    """The shipped defaults, chosen by ``hyde-plus tune`` on SciFact train (300 claims)
    with the local models on both stores (BENCHMARKS.md): the configuration whose worse
    result across FAISS dense and Milvus hybrid was best. Search with the question at
    weight 0.8 (the passage at 0.2, on the keyword side too), skipping queries whose
    passage has a cosine below 0.7 to the question."""
    DEFAULT_QUERY_WEIGHT: ClassVar[float] = 0.8
    DEFAULT_GATE: ClassVar[float | None] = 0.7
    DEFAULT_BLEND: ClassVar[float] = 0.3
    """The rerank blend when ``strategy="rerank"`` is asked for without one."""
    CHARACTERS_PER_TOKEN: ClassVar[int] = 4
    """English text averages about 4 characters per token: a passage of
    ``max_characters`` needs at most ``max_characters / 4`` tokens (`max_tokens`)."""
    TUNE_QUERY_WEIGHTS: ClassVar[tuple[float, ...]] = (0.5, 0.6, 0.7, 0.8, 0.9)
    TUNE_BLENDS: ClassVar[tuple[float, ...]] = (0.1, 0.2, 0.3, 0.5)
    TUNE_GATES: ClassVar[tuple[float, ...]] = (0.5, 0.6, 0.7)

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
        grounded: int = 0,
        context_characters: int = 400,
        **options: Unpack[LLMOptions],
    ) -> None:
        check_int(max_characters, "max_characters", 1, None)
        check_int(num_passages, "num_passages", 1, 16)
        check_int(grounded, "grounded", 0, 20)
        check_int(context_characters, "context_characters", 1, None)
        if strategy is not None and strategy not in ("replace", "rerank"):
            raise ValueError(f"strategy must be 'replace' or 'rerank', not {strategy!r}")
        if blend is not None and strategy != "rerank":
            raise ValueError("blend only applies with strategy='rerank'; add it or drop blend")
        super().__init__(llm, **options)
        self.max_characters = max_characters
        self.num_passages = num_passages
        self.context_characters = context_characters
        shipped = include_query is None and query_weight is None
        self.query_weight, self.include_query = _resolve_weight(
            query_weight, include_query, self.DEFAULT_QUERY_WEIGHT
        )
        self.keyword_weight = (
            check_weight(keyword_weight, "keyword_weight")
            if keyword_weight is not None
            else self.query_weight
        )
        self.guards, self._explicit_guards = self._guards(strategy, blend, gate, grounded, shipped)

    @classmethod
    def _guards(
        cls,
        strategy: Strategy | None,
        blend: float | None,
        gate: float | _Unset | None,
        grounded: int,
        shipped: bool,
    ) -> tuple[Guards, bool]:
        """The guards to carry out, and whether the caller asked for any (a chain must
        refuse those, not drop them). ``shipped``: the defaults apply."""
        explicit = (
            strategy == "rerank"
            or (not isinstance(gate, _Unset) and gate is not None)
            or grounded > 0
        )
        if strategy is None:
            strategy = cls.DEFAULT_STRATEGY if shipped else "replace"
        if isinstance(gate, _Unset):
            gate = cls.DEFAULT_GATE if shipped else None
        guards = Guards(
            context_k=grounded,
            strategy=strategy,
            blend=cls.DEFAULT_BLEND if blend is None else blend,
            gate=gate,
        )
        return guards, explicit

    @classmethod
    def count_option(cls) -> str | None:
        return "num_passages"

    @classmethod
    def complexity(cls, options: dict[str, Any]) -> int:
        """Grounding costs a search and a longer prompt (4), a gate extra embeddings
        (2), a rerank the documents' vectors (1)."""
        level = 0
        if options.get("grounded"):
            level += 4
        if options.get("gate") is not None:
            level += 2
        if options.get("strategy") == "rerank":
            level += 1
        return level

    @classmethod
    def prompt_for_task(cls, task: str) -> str | None:
        """The HyDE paper's prompt for ``task`` (scifact, fiqa, trec-covid...), else
        ``task`` itself as a template."""
        return HYDE_PAPER_PROMPTS.get(task, task)

    @classmethod
    def tune_grid(cls) -> list[dict[str, object]]:
        """Query weight (replace) or blend (rerank), each without and with a gate, free
        and grounded; passages only (weight 0, the paper without the query) and the
        paper's plain mean are included for the record."""
        grid: list[dict[str, object]] = []
        for grounded in (0, 3):
            for gate in (None, *cls.TUNE_GATES):
                base: dict[str, object] = {}
                if grounded:
                    base["grounded"] = grounded
                if gate is not None:
                    base["gate"] = gate
                for w in cls.TUNE_QUERY_WEIGHTS:
                    grid.append({**base, "query_weight": w})
                for b in cls.TUNE_BLENDS:
                    grid.append({**base, "strategy": "rerank", "blend": b})
        return [{"include_query": False}, {"include_query": True}, *grid]

    def chain_stage(self) -> HyDE:
        """This transform as the second stage of ``a.then(self)``: a chain searches
        every sub-question with its own vector, so the guards that act on one
        question's own search (rerank, gate, grounding) cannot apply. Defaults are
        dropped (the query weight stays); options you asked for are a `ValueError`."""
        if self._explicit_guards:
            raise ValueError(
                "then() cannot compose HyDE with strategy='rerank', grounded or a gate "
                "(they act on one question's own search); use it on its own"
            )
        stage = copy.copy(self)
        stage.guards = Guards()
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
        return self.guards.context_k

    def _params(self) -> dict[str, object]:
        # the search options only change how passages are searched, not the passages
        params: dict[str, object] = {
            "temperature": self.temperature,
            "max_characters": self.max_characters,
            "num_passages": self.num_passages,
        }
        if self.grounded:
            params["context_characters"] = self.context_characters
        return params

    def _num_calls(self) -> int:
        return self.num_passages

    @property
    def max_tokens(self) -> int:
        """Tokens a passage may take: what ``max_characters`` can keep, so nothing is
        generated only to be trimmed away."""
        return max(1, -(-self.max_characters // self.CHARACTERS_PER_TOKEN))

    def _reply_tokens(self) -> int | None:
        return self.max_tokens

    def _call_kwargs(self) -> dict[str, object]:
        kwargs = super()._call_kwargs()
        own = getattr(self.llm, "max_tokens", None)
        if not (isinstance(own, int) and 0 < own <= self.max_tokens):
            kwargs["max_tokens"] = self.max_tokens  # lower than the model's own cap
        return kwargs

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

    def _restyle(self, result: TransformResult, **changes: Any) -> TransformResult:
        return replace(
            result,
            include_query=self.include_query,
            query_weight=self.query_weight,
            keyword_weight=self.keyword_weight,
            **changes,
        )

    def _build(self, query: str, replies: list[str], usage: Usage) -> TransformResult:
        passages = [trim_passage(_ECHO.sub("", r), self.max_characters) for r in replies]
        passages = [p for p in passages if p]
        if not passages:
            raise UnusableReplyError("the LLM returned an empty passage")
        if len(passages) > 1 and len(dedupe(passages)) < len(passages):
            # identical samples add nothing to the mean; keep the weight honest
            passages = dedupe(passages)
        return TransformResult(
            query=query,
            method=self.method,
            queries=(query,),
            hypothetical=tuple(passages),
            include_query=self.include_query,
            usage=usage,
            query_weight=self.query_weight,
            keyword_weight=self.keyword_weight,
        )


def _resolve_weight(
    query_weight: float | None, include_query: bool | None, default: float
) -> tuple[float | None, bool]:
    """``(query_weight, include_query)`` from what the caller said: an explicit weight
    wins (and must agree with ``include_query``); ``include_query`` alone means the
    paper's plain mean (True) or passages only (False); neither means ``default``."""
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
    if include_query is None:
        return default, default > 0
    return None, bool(include_query)
