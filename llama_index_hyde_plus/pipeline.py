"""Two-stage HyDE RAG (`HyDERAG`) and an evaluation wrapper (`query_for_evaluation`).

Stage 1 writes a hypothetical document with its own, creative model (temperature 0.7
by default) and retrieves the top ``top_k`` real documents with it. Stage 2 answers
from those documents with a separate, precise model (temperature 0) and the ORIGINAL
question. Tokens, cost and time are measured per stage, with their sources, and
`query_for_evaluation` returns them in the question/answer/contexts/metadata shape that
Ragas-style evaluators take.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.indices.base import BaseIndex
from llama_index.core.llms import LLM
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.schema import NodeWithScore
from llama_index.core.settings import Settings

from ._checks import check_number, is_int, is_number
from .calls import llm as _llm
from .search.retriever import MAX_TOP_K, SearchResult, TransformRetriever
from .transforms.hyde import HyDE
from .transforms.options import check_prices
from .usage import ModelPrice, Usage

ANSWER_PROMPT = (
    "Answer the question using only the context below. If the context does not contain "
    "the answer, say that you do not know.\n\n"
    "Context:\n{context}\n\n"
    "Question: {query}\n"
    "Answer:"
)


def provider_of(llm: Any) -> str:
    """A short provider name for an LLM: ``openai``, ``llama.cpp``, or its class name."""
    name = type(llm).__name__
    module = type(llm).__module__
    if "openai" in module.lower():
        return "openai"
    if getattr(llm, "is_local", False) and name == "LocalLLM":
        return "llama.cpp"
    try:
        return str(llm.class_name())
    except Exception:
        return name


def _combined(a: str, b: str) -> str:
    return a if a == b else f"hyde={a},answer={b}"


@dataclass(frozen=True)
class HyDERAGResult:
    """Everything one `HyDERAG` query did, per stage."""

    question: str
    answer: str
    nodes: list[NodeWithScore]
    search: SearchResult
    hyde_usage: Usage
    answer_usage: Usage
    hyde_latency_s: float
    retrieval_latency_s: float
    answer_latency_s: float
    execution_time_s: float
    hyde_model: str | None
    answer_model: str | None
    hyde_provider: str
    answer_provider: str
    answer_model_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def contexts(self) -> list[str]:
        """The retrieved nodes' texts, in rank order."""
        return [n.node.get_content() for n in self.nodes]

    @property
    def hypothetical_document(self) -> str:
        """HyDE's passages joined by blank lines ("" when it fell back)."""
        return "\n\n".join(self.search.transform.hypothetical)

    @property
    def usage(self) -> Usage:
        """What both stages cost: HyDE's calls plus the answer's."""
        return self.hyde_usage + self.answer_usage

    def metadata(self) -> dict[str, Any]:
        """The evaluation metadata (every key of the reference pipeline, plus per-stage
        detail)."""
        t = self.search.transform
        return {
            "execution_time": self.execution_time_s,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "total_tokens": self.usage.total_tokens,
            "total_cost": self.usage.cost,
            "retrieval_method": "hyde",
            "llm_hyde_model": self.hyde_model,
            "llm_answer_model": self.answer_model,
            "hyde_provider": self.hyde_provider,
            "answer_provider": self.answer_provider,
            "hyde_model_id": self.hyde_model,
            "answer_model_id": self.answer_model_id or self.answer_model,
            "hyde_cost": self.hyde_usage.cost,
            "answer_cost": self.answer_usage.cost,
            "usage_source": _combined(self.hyde_usage.usage_source, self.answer_usage.usage_source),
            "cost_source": _combined(self.hyde_usage.cost_source, self.answer_usage.cost_source),
            "hyde_input_tokens": self.hyde_usage.input_tokens,
            "hyde_output_tokens": self.hyde_usage.output_tokens,
            "answer_input_tokens": self.answer_usage.input_tokens,
            "answer_output_tokens": self.answer_usage.output_tokens,
            "hyde_latency": self.hyde_latency_s,
            "retrieval_latency": self.retrieval_latency_s,
            "answer_latency": self.answer_latency_s,
            "hypothetical_document": self.hypothetical_document,
            "hyde_fallback": t.fallback,
            "hyde_error": t.error,
        }


def _answer_template(answer_prompt: Any) -> BasePromptTemplate:
    """``answer_prompt`` (None: `ANSWER_PROMPT`) as a template holding ``{context}`` and
    ``{query}``; else a `TypeError` / `ValueError` naming ``answer_prompt``."""
    template = ANSWER_PROMPT if answer_prompt is None else answer_prompt
    if isinstance(template, str):
        template = PromptTemplate(template)
    if not isinstance(template, BasePromptTemplate):
        raise TypeError(
            f"answer_prompt must be a string or a prompt template, not {type(template).__name__}"
        )
    if not {"context", "query"} <= set(template.template_vars):
        raise ValueError("answer_prompt must contain {context} and {query}")
    return template


class HyDERAG:
    """HyDE retrieval plus a grounded answer, with separate models per stage.

    ``index_or_retriever`` is a LlamaIndex index (searched with ``top_k``) or any
    retriever (its results cut to ``top_k``). ``hyde_llm``/``answer_llm`` default to
    ``Settings.llm``; ``hyde_temperature`` (0.7) and ``answer_temperature`` (0) are
    passed on each call. The answer call has ``answer_timeout`` seconds (60; ``None``:
    unbounded) and retries transient provider errors with HyDE's ``retry`` policy; it
    has no fallback, so its failure is raised. Other HyDE options (``num_passages``,
    ``include_query``, ``max_characters``, ``prompt``...) go to `HyDE`;
    ``answer_prompt`` needs ``{context}`` and ``{query}``.
    """

    def __init__(
        self,
        index_or_retriever: BaseIndex[Any] | BaseRetriever,
        *,
        hyde_llm: LLM | None = None,
        answer_llm: LLM | None = None,
        top_k: int = 5,
        hyde_temperature: float | None = 0.7,
        answer_temperature: float | None = 0.0,
        answer_timeout: float | None = 60.0,
        answer_prompt: str | BasePromptTemplate | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
        callback_manager: CallbackManager | None = None,
        **hyde_options: Any,
    ) -> None:
        if not is_int(top_k) or not 1 <= top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be an int from 1 to {MAX_TOP_K}")
        if not isinstance(index_or_retriever, (BaseIndex, BaseRetriever)):
            raise TypeError("index_or_retriever must be a LlamaIndex index or retriever")
        self.answer_prompt = _answer_template(answer_prompt)
        if answer_llm is not None and not isinstance(answer_llm, LLM):
            raise TypeError(f"answer_llm must be a LlamaIndex LLM, not {type(answer_llm).__name__}")
        self._answer_llm = answer_llm
        for name, temperature in (("hyde", hyde_temperature), ("answer", answer_temperature)):
            if temperature is not None:
                check_number(temperature, f"{name}_temperature", 0.0, 2.0)
        self.answer_temperature = answer_temperature
        if answer_timeout is not None and not (
            is_number(answer_timeout) and 0 < answer_timeout < 1e6
        ):
            raise ValueError("answer_timeout must be a number of seconds > 0 (or None)")
        self.answer_timeout = answer_timeout
        check_prices(prices)
        self.prices = dict(prices) if prices else None
        self._callback_manager = callback_manager
        self.hyde = HyDE(
            hyde_llm,
            temperature=hyde_temperature,
            prices=prices,
            callback_manager=callback_manager,
            **hyde_options,
        )
        if isinstance(index_or_retriever, BaseIndex):
            # fetches deeper when HyDE's guards need candidates (a rerank strategy)
            self.retriever = TransformRetriever.from_index(
                index_or_retriever, self.hyde, similarity_top_k=top_k
            )
        else:
            self.retriever = TransformRetriever(index_or_retriever, self.hyde, top_k=top_k)
        self.top_k = top_k

    @property
    def answer_llm(self) -> LLM:
        """The LLM that writes the answer: the one given, else ``Settings.llm``."""
        return self._answer_llm if self._answer_llm is not None else Settings.llm

    def _answer_input(self, question: str, nodes: list[NodeWithScore]) -> str:
        context = (
            "\n\n".join(f"[{i}] {n.node.get_content()}" for i, n in enumerate(nodes, 1))
            or "(no documents found)"
        )
        return self.answer_prompt.format(context=context, query=question)

    def _call_options(self) -> _llm.CallOptions:
        return _llm.CallOptions(
            temperature=self.answer_temperature,
            timeout=self.answer_timeout,
            retry=self.hyde.retry,
            prices=self.prices,
            host_callback_manager=self._callback_manager or Settings.callback_manager,
        )

    def _result(
        self,
        question: str,
        search: SearchResult,
        reply: _llm.LLMReply,
        start: float,
        answer_start: float,
        answer_model_id: str | None,
    ) -> HyDERAGResult:
        now = time.perf_counter()
        hyde_s = search.transform.latency_s
        return HyDERAGResult(
            question=question,
            answer=reply.text.strip(),
            nodes=search.nodes,
            search=search,
            hyde_usage=search.transform.usage,
            answer_usage=reply.usage,
            hyde_latency_s=hyde_s,
            retrieval_latency_s=max(search.latency_s - hyde_s, 0.0),
            answer_latency_s=now - answer_start,
            execution_time_s=now - start,
            hyde_model=_llm.model_name(self.hyde.llm),
            answer_model=_llm.model_name(self.answer_llm),
            hyde_provider=provider_of(self.hyde.llm),
            answer_provider=provider_of(self.answer_llm),
            answer_model_id=answer_model_id,
        )

    def query(self, question: str) -> HyDERAGResult:
        """Run both stages (sync)."""
        start = time.perf_counter()
        search = self.retriever.search(question)
        answer_start = time.perf_counter()
        llm = self.answer_llm
        reply = _llm.complete(llm, self._answer_input(question, search.nodes), self._call_options())
        return self._result(question, search, reply, start, answer_start, reply.model_id)

    async def aquery(self, question: str) -> HyDERAGResult:
        """Run both stages (async; never blocks the event loop)."""
        start = time.perf_counter()
        search = await self.retriever.asearch(question)
        answer_start = time.perf_counter()
        llm = self.answer_llm
        reply = await _llm.acomplete(
            llm, self._answer_input(question, search.nodes), self._call_options()
        )
        return self._result(question, search, reply, start, answer_start, reply.model_id)


def _llm_from(name: str | None, custom: LLM | None, temperature: float) -> LLM | None:
    if custom is not None:
        return custom
    if not name:
        return None
    from .models import resolve_llm

    spec = name if name.startswith(("openai:", "local", "auto")) else f"openai:{name}"
    return resolve_llm(spec, temperature=temperature)


def _build(
    index: BaseIndex[Any] | None,
    retriever: BaseRetriever | None,
    hyde_model: str | None,
    answer_model: str | None,
    custom_hyde_llm: LLM | None,
    custom_answer_llm: LLM | None,
    top_k: int,
    options: dict[str, Any],
) -> HyDERAG:
    if (index is None) == (retriever is None):
        raise ValueError("pass exactly one of index= or retriever=")
    source: Any = index if index is not None else retriever
    return HyDERAG(
        source,
        hyde_llm=_llm_from(hyde_model, custom_hyde_llm, options.get("hyde_temperature", 0.7)),
        answer_llm=_llm_from(
            answer_model, custom_answer_llm, options.get("answer_temperature", 0.0)
        ),
        top_k=top_k,
        **options,
    )


def _evaluation_record(result: HyDERAGResult) -> dict[str, Any]:
    return {
        "question": result.question,
        "answer": result.answer,
        "contexts": result.contexts,
        "metadata": result.metadata(),
    }


def query_for_evaluation(
    question: str,
    *,
    index: BaseIndex[Any] | None = None,
    retriever: BaseRetriever | None = None,
    hyde_model: str | None = None,
    answer_model: str | None = None,
    custom_hyde_llm: LLM | None = None,
    custom_answer_llm: LLM | None = None,
    top_k: int = 5,
    **options: Any,
) -> dict[str, Any]:
    """Answer ``question`` with `HyDERAG` and return ``{"question", "answer", "contexts",
    "metadata"}`` for Ragas-style evaluation.

    Pre-configured LLMs (``custom_*_llm``) win over model names; a name is an OpenAI
    model (``"gpt-4o-mini"``) or a CLI spec (``"local"``, ``"openai:gpt-4o"``); with
    neither, ``Settings.llm`` is used. Pass exactly one of ``index`` and ``retriever``.
    ``options`` go to `HyDERAG`.
    """
    rag = _build(
        index,
        retriever,
        hyde_model,
        answer_model,
        custom_hyde_llm,
        custom_answer_llm,
        top_k,
        options,
    )
    return _evaluation_record(rag.query(question))


async def aquery_for_evaluation(
    question: str,
    *,
    index: BaseIndex[Any] | None = None,
    retriever: BaseRetriever | None = None,
    hyde_model: str | None = None,
    answer_model: str | None = None,
    custom_hyde_llm: LLM | None = None,
    custom_answer_llm: LLM | None = None,
    top_k: int = 5,
    **options: Any,
) -> dict[str, Any]:
    """Async twin of `query_for_evaluation` (native async calls throughout)."""
    rag = _build(
        index,
        retriever,
        hyde_model,
        answer_model,
        custom_hyde_llm,
        custom_answer_llm,
        top_k,
        options,
    )
    return _evaluation_record(await rag.aquery(question))
