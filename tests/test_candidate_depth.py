"""One candidate depth for a reranking transform: the ranking does
not depend on how deep the wrapped retriever fetched, and ``hyde-plus query`` fetches
as deep as ``from_index`` and ``eval``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llama_index_hyde_plus import HyDE, TransformRetriever
from llama_index_hyde_plus.cli import app
from llama_index_hyde_plus.search.retriever import RERANK_CANDIDATES, candidate_depth
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM, StaticRetriever

WORDS = ["tide", "moon", "ocean", "salt", "wave", "storm", "coast", "reef", "shell", "sand"]
TEXTS = {
    f"d{i}": f"{WORDS[i % 10]} {WORDS[(i * 3) % 10]} {WORDS[(i * 7) % 10]} {i}" for i in range(120)
}
ORDER = [f"d{i}" for i in range(120)]  # the question's own ranking, best first


def _ranking(fetched: int, *, use_async: bool = False) -> list[str]:
    store = StaticRetriever(TEXTS, default=ORDER[:fetched])
    hyde = HyDE(ScriptedLLM(["storm coast reef storm coast reef"]), strategy="rerank")
    retriever = TransformRetriever(store, hyde, top_k=10, embed_model=DeterministicEmbedding())
    if use_async:
        import asyncio

        nodes = asyncio.run(retriever.aretrieve("when is the tide highest"))
    else:
        nodes = retriever.retrieve("when is the tide highest")
    return [n.node.node_id for n in nodes]


@pytest.mark.parametrize("use_async", [False, True])
def test_a_rerank_ranking_does_not_depend_on_how_deep_the_store_fetched(use_async: bool) -> None:
    at_depth = _ranking(RERANK_CANDIDATES, use_async=use_async)
    assert at_depth != ORDER[:10]  # the passage moved something
    assert _ranking(100, use_async=use_async) == at_depth  # eval and serve fetch 100
    assert _ranking(RERANK_CANDIDATES + 7, use_async=use_async) == at_depth


def test_hits_past_the_rerank_depth_follow_in_their_order_and_below() -> None:
    store = StaticRetriever(TEXTS, default=ORDER[:100])
    hyde = HyDE(ScriptedLLM(["storm coast reef"]), strategy="rerank")
    retriever = TransformRetriever(store, hyde, top_k=100, embed_model=DeterministicEmbedding())
    nodes = retriever.retrieve("when is the tide highest")
    ids = [n.node.node_id for n in nodes]
    assert sorted(ids[:RERANK_CANDIDATES]) == sorted(ORDER[:RERANK_CANDIDATES])
    assert ids[RERANK_CANDIDATES:] == ORDER[RERANK_CANDIDATES:100]
    scores = [n.score or 0.0 for n in nodes]
    assert scores == sorted(scores, reverse=True)


def test_query_opens_the_store_at_the_candidate_depth_of_its_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index_hyde_plus.stores.base import Store

    config = tmp_path / "rerank.json"
    from llama_index_hyde_plus.transforms.config import CONFIG_FORMAT

    tuned = {
        "hyde_plus_config": CONFIG_FORMAT,
        "transform": "hyde",
        "options": {"strategy": "rerank"},
    }
    config.write_text(json.dumps(tuned))
    asked: list[int] = []

    def fake_open(self: Any, top_k: int, *, embed: str | None = None) -> Any:
        asked.append(top_k)
        return StaticRetriever(TEXTS, default=ORDER[:top_k])

    monkeypatch.setattr(Store, "open", fake_open)
    index = tmp_path / "idx"
    index.mkdir()
    result = CliRunner().invoke(
        app,
        [
            *("query", "q", "--index", str(index), "--config", str(config), "-k", "3"),
            *("--json", "--llm", "scripted"),  # not the local model: the depth is what counts
        ],
    )
    hyde = HyDE(ScriptedLLM(["x"]), strategy="rerank")
    assert asked == [candidate_depth(hyde.guards, 3)] == [RERANK_CANDIDATES], result.output
