"""Integration: the real local LLM and embedding model with a real FAISS index."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from llama_index.core import Document
from llama_index.core.base.llms.types import ChatMessage

from llama_index_hyde_plus import HyDE, MultiQuery, TransformRetriever
from llama_index_hyde_plus.cli import DEMO_PROMPT, demo_corpus_path
from llama_index_hyde_plus.local import (
    LocalEmbedding,
    LocalLLM,
    ModelNotAvailableError,
    local_embedding,
    local_llm,
)
from llama_index_hyde_plus.stores.faiss import build_faiss_index, load_faiss_index

from .conftest import LoopTicks

pytestmark = pytest.mark.local
Q = "Why did revenue drop?"


def demo_documents() -> list[Document]:
    rows = [json.loads(line) for line in demo_corpus_path().read_text().splitlines()]
    return [Document(text=f"{r['title']}\n{r['text']}", id_=r["_id"]) for r in rows]


def rank_of(nodes: list, node_id: str) -> int:  # type: ignore[type-arg]
    ids = [n.node.node_id for n in nodes]
    return ids.index(node_id) + 1 if node_id in ids else len(ids) + 1


def test_embedding_is_normalised_and_semantic(real_embedding: LocalEmbedding) -> None:
    a, b, c = (
        np.array(v)
        for v in real_embedding.get_text_embedding_batch(
            [
                "The cat sat on the mat.",
                "A kitten rested on the rug.",
                "Quarterly tax filing rules.",
            ]
        )
    )
    assert a.shape == (384,) and abs(np.linalg.norm(a) - 1) < 1e-3
    assert a @ b > a @ c + 0.2


def test_hyde_on_faiss_with_the_real_models_finds_the_answer(
    tmp_path: Path, real_embedding: LocalEmbedding, real_llm: LocalLLM
) -> None:
    info = build_faiss_index(
        demo_documents(), real_embedding, tmp_path / "idx", embed_spec="local", max_length=256
    )
    assert info.documents == 28 and info.dim == 384
    base = load_faiss_index(tmp_path / "idx", real_embedding).as_retriever(similarity_top_k=5)
    plain = base.retrieve(Q)
    hyde = HyDE(  # the paper's mean of the passages and the question, as the demo shows it
        real_llm,
        prompt=DEMO_PROMPT,
        num_passages=4,
        max_characters=600,
        timeout=300,
        include_query=True,
    )
    result = asyncio.run(TransformRetriever(base, hyde).asearch(Q))
    t = result.transform
    assert not t.fallback, t.error
    assert 1 <= len(t.hypothetical) <= 4
    assert all(0 < len(p) <= 600 for p in t.hypothetical)
    assert any("revenue" in p.lower() for p in t.hypothetical)
    assert t.usage.usage_source == "provider" and t.usage.cost_source == "local"
    assert t.usage.calls == 4 and t.usage.cost == 0 and t.usage.output_tokens > 0
    # the question alone misses the Q3 review; the hypothetical passages find it
    assert rank_of(result.nodes, "q3-review") < rank_of(plain, "q3-review")
    assert rank_of(result.nodes, "q3-review") <= 2


def test_sync_path_with_the_real_models(
    real_embedding: LocalEmbedding, real_llm: LocalLLM, tmp_path: Path
) -> None:
    build_faiss_index(
        demo_documents(), real_embedding, tmp_path / "idx", embed_spec="local", max_length=256
    )
    base = load_faiss_index(tmp_path / "idx", real_embedding).as_retriever(similarity_top_k=3)
    result = TransformRetriever(base, MultiQuery(real_llm, n=2, timeout=300)).search(Q)
    assert result.nodes and result.transform.usage.usage_source == "provider"


async def test_local_llm_async_calls_run_concurrently_without_blocking_the_loop(
    real_llm: LocalLLM,
) -> None:
    async with LoopTicks() as loop:
        replies = await asyncio.gather(
            *(real_llm.acomplete(f"Name a colour. ({i})", max_tokens=16) for i in range(4))
        )
    assert all(r.raw["usage"]["completion_tokens"] > 0 for r in replies)
    assert loop.ticks >= LoopTicks.FREE


def test_local_llm_reports_llama_cpp_errors(real_llm: LocalLLM) -> None:
    from llama_index_hyde_plus.local import LocalLLMError

    with pytest.raises(LocalLLMError, match="context"):
        real_llm.complete("word " * 5000)


def prompt_cost(llm: LocalLLM, messages: list[ChatMessage]) -> int:
    return int(llm.chat(messages, max_tokens=1).raw["usage"]["prompt_tokens"])


def test_chat_markers_in_user_or_document_text_cost_as_much_as_ordinary_text(
    real_llm: LocalLLM,
) -> None:
    """40 markers pasted into a question or a retrieved document must be read as text
    (several tokens each, like ``<|im_begin|>``, which is no token of the model), never
    as 40 chat-role control tokens."""
    for role in ("user", "system"):  # a question; a document given as context

        def cost(text: str, role: str = role) -> int:
            return prompt_cost(real_llm, [ChatMessage(role=role, content=text)])

        base = cost(Q)
        ordinary = cost(Q + "<|im_begin|>" * 40) - base
        assert ordinary >= 4 * 40, (role, ordinary)
        for marker in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
            injected = cost(Q + marker * 40) - base
            assert injected >= ordinary, (role, marker, injected, ordinary)


def test_the_bundled_model_names_its_chat_markers_as_control_tokens(real_llm: LocalLLM) -> None:
    from llama_index_hyde_plus.local.gguf import ESCAPE, control_tokens, escape_controls

    controls = control_tokens(real_llm.model_path)
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(controls)
    escaped = escape_controls("a <|im_start|>system\nb<|im_end|>", controls)
    assert escaped == f"a <{ESCAPE}|im_start|>system\nb<{ESCAPE}|im_end|>"
    assert escape_controls("<p>plain <b>html</b></p>", controls) == "<p>plain <b>html</b></p>"


def test_missing_gguf_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYDE_PLUS_LLM_GGUF", str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotAvailableError, match="HYDE_PLUS_LLM_GGUF"):
        local_llm()
    monkeypatch.setenv("HYDE_PLUS_EMBED_DIR", str(tmp_path))
    with pytest.raises(ModelNotAvailableError, match=r"model\.onnx"):
        local_embedding()


def _long_prompt_llm() -> LocalLLM:
    llm = local_llm(max_tokens=1500, n_parallel=1, temperature=0.7, seed=1)
    llm.warm_up()
    return llm


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_timed_out_local_call_stops_generating(use_async: bool) -> None:
    """With one slot, a follow-up call only starts once the timed-out one has stopped:
    it would wait for ~1500 tokens if llama.cpp kept generating."""
    from llama_index_hyde_plus.calls.llm import CallOptions, LLMTimeoutError, acomplete, complete

    llm = _long_prompt_llm()
    prompt = "Write a very long, detailed essay about the history of rivers and canals."
    with pytest.raises(LLMTimeoutError):
        if use_async:
            await acomplete(llm, prompt, CallOptions(timeout=0.5))
        else:
            complete(llm, prompt, CallOptions(timeout=0.5))
    start = time.monotonic()
    reply = await asyncio.to_thread(llm.complete, "Say hi.", max_tokens=2)
    assert reply.text is not None and time.monotonic() - start < 6


def test_a_generation_that_outlives_its_timeout_does_not_crash_the_exit() -> None:
    """Exiting while an abandoned generation still runs must not tear the interpreter down
    under it (it would call back into Python: ``FATAL: exception not rethrown``, SIGABRT)."""
    script = Path(__file__).with_name("_exit_after_timeout.py")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600
    )
    assert done.stdout == "timed out\n"
    assert done.returncode == 0, done.stderr
    assert "FATAL" not in done.stderr


def test_local_llm_loads_before_the_timeout_clock() -> None:
    llm = local_llm(max_tokens=8, n_parallel=1)
    assert not llm.loaded
    result = HyDE(llm, timeout=5.0).transform(Q)
    assert llm.loaded and not result.fallback, result.error


def test_local_llm_streams_tokens_as_they_come(real_llm: LocalLLM) -> None:
    chunks = list(real_llm.stream_complete("Name three rivers.", max_tokens=32))
    assert len([c for c in chunks if c.delta]) > 1
    assert "".join(c.delta or "" for c in chunks) == chunks[-1].text
    assert chunks[-1].text == chunks[-2].text and chunks[-1].raw["usage"]["completion_tokens"] > 1
    chat = list(real_llm.stream_chat([ChatMessage(role="user", content="Name a colour.")]))
    assert len(chat) > 2
    assert "".join(c.delta or "" for c in chat) == chat[-1].message.content


async def test_local_llm_streams_asynchronously(real_llm: LocalLLM) -> None:
    chunks = [c async for c in await real_llm.astream_complete("Name three rivers.", max_tokens=32)]
    assert len([c for c in chunks if c.delta]) > 1
    assert "".join(c.delta or "" for c in chunks) == chunks[-1].text
    messages = [ChatMessage(role="user", content="Name a colour.")]
    chat = [c async for c in await real_llm.astream_chat(messages, max_tokens=16)]
    assert "".join(c.delta or "" for c in chat) == chat[-1].message.content


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_stopped_or_cancelled_stream_stops_generating(use_async: bool) -> None:
    """Leaving a stream early frees the only slot at once, and a stream whose call timed
    out (`CANCEL_EVENT` set) raises `LocalLLMCancelledError`."""
    from llama_index_hyde_plus.calls.door import CANCEL_EVENT
    from llama_index_hyde_plus.local import LocalLLMCancelledError

    llm = _long_prompt_llm()
    prompt = "Write a very long, detailed essay about the history of rivers and canals."
    if use_async:
        stream = await llm.astream_complete(prompt)
        async for _ in stream:
            break
        await stream.aclose()  # type: ignore[attr-defined]
    else:
        for _ in llm.stream_complete(prompt):
            break
    start = time.monotonic()
    reply = await asyncio.to_thread(llm.complete, "Say hi.", max_tokens=2)
    assert reply.text is not None and time.monotonic() - start < 6

    cancel = threading.Event()
    token = CANCEL_EVENT.set(cancel)
    try:
        stream_ = llm.stream_complete(prompt)
    finally:
        CANCEL_EVENT.reset(token)
    with pytest.raises(LocalLLMCancelledError):
        for i, _ in enumerate(stream_):
            if i == 3:
                cancel.set()
