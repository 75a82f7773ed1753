"""A RAG Workflow: rewrite, stream what the rewrite wrote, retrieve, answer.

LlamaIndex 0.14 composes pipelines as Workflows. Here the transform is one step of
its own: its output (the hypothetical passage, the generated queries, whether it fell
back) goes to the event stream as soon as it exists, so a UI can show it while the
search and the answer are still running; the retrieve step then searches with that
very rewrite (``asearch(..., transformed=...)``: the LLM is not asked twice).

With OPENAI_API_KEY set, OpenAI writes the passage and the answer; without one, a
scripted LLM and a deterministic embedding stand in, so the example runs anywhere.

    uv run python examples/workflow_rag.py
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.response_synthesizers import get_response_synthesizer
from llama_index.core.schema import NodeWithScore
from llama_index.core.workflow import Context, Event, StartEvent, StopEvent, Workflow, step

from llama_index_hyde_plus import HyDE, TransformResult, TransformRetriever

DOCS = [
    "Enterprise renewals slipped last quarter as three large accounts delayed signing.",
    "Revenue team members can drop by the Friday lunch in the main kitchen.",
    "The company hired forty engineers for the new platform team in Berlin.",
    "Employees receive twenty five days of paid time off each year.",
]


class Rewritten(Event):
    """The transform's output, for the retrieve step."""

    question: str
    result: TransformResult


class RewriteWritten(Event):
    """Streamed to the caller as soon as the rewrite exists."""

    method: str
    hypothetical: list[str]
    queries: list[str]
    fallback: bool


class Retrieved(Event):
    question: str
    nodes: list[NodeWithScore]


class HyDERAGWorkflow(Workflow):
    """rewrite -> retrieve -> answer, with the rewrite streamed as an event."""

    def __init__(self, retriever: TransformRetriever, llm: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.retriever = retriever
        self.synthesizer = get_response_synthesizer(llm=llm)

    @step
    async def rewrite(self, ctx: Context, ev: StartEvent) -> Rewritten:
        question = str(ev.get("question"))
        result = await self.retriever.transformer.atransform_safe(question)  # never raises
        ctx.write_event_to_stream(
            RewriteWritten(
                method=result.method,
                hypothetical=list(result.hypothetical),
                queries=list(result.search_queries),
                fallback=result.fallback,
            )
        )
        return Rewritten(question=question, result=result)

    @step
    async def retrieve(self, ev: Rewritten) -> Retrieved:
        found = await self.retriever.asearch(ev.question, transformed=ev.result)
        return Retrieved(question=ev.question, nodes=found.nodes)

    @step
    async def answer(self, ev: Retrieved) -> StopEvent:
        response = await self.synthesizer.asynthesize(ev.question, nodes=ev.nodes)
        return StopEvent(result=response)


def models() -> tuple[Any, Any]:
    if os.environ.get("OPENAI_API_KEY"):
        from llama_index.embeddings.openai import OpenAIEmbedding
        from llama_index.llms.openai import OpenAI

        return OpenAI(model="gpt-4o-mini"), OpenAIEmbedding(model="text-embedding-3-small")
    from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

    print("(no OPENAI_API_KEY: using the scripted LLM and deterministic embedding)\n")

    def respond(prompt: str) -> str:
        if "Context information" in prompt:  # the answer prompt
            return "Revenue dropped because enterprise renewals slipped last quarter."
        return "Revenue fell as enterprise renewals slipped when large accounts delayed signing."

    return ScriptedLLM(respond=respond), DeterministicEmbedding(dim=256)


async def main() -> None:
    llm, embed_model = models()
    index = VectorStoreIndex.from_documents(
        [Document(text=t) for t in DOCS], embed_model=embed_model
    )
    retriever = TransformRetriever.from_index(index, HyDE(llm), similarity_top_k=2)
    workflow = HyDERAGWorkflow(retriever, llm, timeout=120)
    handler = workflow.run(question="Why did revenue drop?")
    async for event in handler.stream_events():
        if isinstance(event, RewriteWritten):
            written = event.hypothetical or event.queries
            print(f"{event.method} wrote: {written[0]}")
    response = await handler
    print("Answer:", response)
    print("Top source:", response.source_nodes[0].node.get_content())


if __name__ == "__main__":
    asyncio.run(main())
