"""The strong-generator stand-in (``--llm oracle:P``): what it draws, what it removes,
and that it is reproducible."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import Document

from llama_index_hyde_plus import HyDE, MultiQuery
from llama_index_hyde_plus.evaluation import run_eval
from llama_index_hyde_plus.evaluation.beir import BeirDataset
from llama_index_hyde_plus.evaluation.runner import EvalSession, run_standin
from llama_index_hyde_plus.evaluation.standin import (
    Draw,
    OracleLLM,
    StandIn,
    answer_text,
    draw,
    eligible,
    oracle_llm,
    reduced,
)
from llama_index_hyde_plus.testing import DeterministicEmbedding

TOPICS = ["renewals", "vacation", "laptops", "pricing", "hiring", "office"]


def dataset() -> BeirDataset:
    """Six topics, four documents each (two relevant to the topic's question, two
    about it but judged non-relevant), and one question with a single relevant document."""
    corpus: dict[str, tuple[str, str]] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for t, topic in enumerate(TOPICS):
        for k in range(4):
            corpus[f"{topic}-{k}"] = (
                f"{topic.title()} report {k}",
                f"A note about {topic} number {k}. It has details on {topic} policy {k}.",
            )
        queries[f"q{t}"] = f"What changed about {topic} this year?"
        qrels[f"q{t}"] = {f"{topic}-0": 1, f"{topic}-1": 2, f"{topic}-3": 0}
    corpus["lonely"] = ("Lunch", "The Friday lunch is in the main kitchen.")
    queries["q-single"] = "Where is the Friday lunch?"
    qrels["q-single"] = {"lonely": 1}
    digest = hashlib.sha256(repr(sorted(corpus.items())).encode()).hexdigest()
    return BeirDataset("synthetic", corpus, queries, qrels, digest)


def rankings(ds: BeirDataset) -> dict[str, list[str]]:
    """A plain-search ranking stand-in: every document of the question's topic first."""
    out = {}
    for qid, text in ds.queries.items():
        topic = next((t for t in TOPICS if t in text), "lonely")
        mine = [d for d in ds.corpus if d.startswith(topic)]
        out[qid] = mine + [d for d in ds.corpus if d not in mine]
    return out


def test_only_questions_with_two_relevant_documents_take_part() -> None:
    assert eligible(dataset()) == [f"q{t}" for t in range(len(TOPICS))]


def test_p_one_draws_only_relevant_documents_and_p_zero_only_wrong_ones() -> None:
    ds = dataset()
    for seed in range(5):
        right = draw(ds, rankings(ds), 1.0, seed, depth=4)
        wrong = draw(ds, rankings(ds), 0.0, seed, depth=4)
        assert len(right) == len(wrong) == len(TOPICS)
        assert all(d.right and ds.qrels[q][d.doc_id] > 0 for q, d in right.items())
        assert all(not d.right and ds.qrels[q].get(d.doc_id, 0) <= 0 for q, d in wrong.items())
        # a wrong answer is one of the question's own top hits, judged non-relevant
        assert all(d.doc_id in rankings(ds)[q][:4] for q, d in wrong.items())


def test_draws_are_reproducible_per_seed_and_differ_between_seeds() -> None:
    ds = dataset()
    assert draw(ds, rankings(ds), 0.5, 7) == draw(ds, rankings(ds), 0.5, 7)
    seen = {tuple(sorted(draw(ds, rankings(ds), 0.5, s).items())) for s in range(8)}
    assert len(seen) > 1


def test_reduced_set_loses_every_drawn_document_from_corpus_and_judgements() -> None:
    ds = dataset()
    draws = draw(ds, rankings(ds), 0.5, 3)
    sub = reduced(ds, draws)
    gone = {d.doc_id for d in draws.values()}
    assert gone and not gone & set(sub.corpus)
    assert all(not gone & set(judged) for judged in sub.qrels.values())
    assert set(sub.queries) == set(draws)  # every drawn question keeps a relevant document
    assert sub.corpus_sha256 != ds.corpus_sha256


def test_a_shared_relevant_document_is_not_drawn_when_it_would_leave_a_question_unscored() -> None:
    ds = dataset()
    # q0 and q1 share their only two relevant documents: drawing both would leave
    # one of them with nothing to score
    ds.qrels["q1"] = {"renewals-0": 1, "renewals-1": 1}
    ds.queries["q1"] = "What changed about renewals again?"
    for seed in range(10):
        draws = draw(ds, rankings(ds), 1.0, seed)
        sub = reduced(ds, draws)
        assert set(sub.queries) == set(draws)
        assert {"q0", "q1"} - set(draws)  # at most one of the two could be drawn


def test_the_stand_in_writes_passages_for_hyde_and_titles_for_fan_outs() -> None:
    ds = dataset()
    passage = answer_text(ds, "laptops-1", "passage", characters=60)
    assert passage.startswith("Laptops report 1") and len(passage) <= 60
    assert answer_text(ds, "laptops-1", "query") == "Laptops report 1"
    untitled = BeirDataset("x", {"d": ("", "First sentence here. Second one.")}, {}, {}, "0")
    assert answer_text(untitled, "d", "query") == "First sentence here."


def test_the_oracle_llm_answers_the_question_in_the_prompt_and_transforms_use_it() -> None:
    ds = dataset()
    draws = {"q2": Draw("laptops-1", True)}
    llm = oracle_llm(ds, draws, "passage", characters=400, label="oracle:1")
    result = HyDE(llm, include_query=True).transform(ds.queries["q2"])
    assert not result.fallback
    assert result.hypothetical[0].startswith("Laptops report 1")
    assert asyncio.run(HyDE(llm).atransform(ds.queries["q2"])).hypothetical == result.hypothetical
    titles = oracle_llm(ds, draws, "query", characters=400, label="oracle:1")
    fan = MultiQuery(titles, original_weight=1.0).transform(ds.queries["q2"])
    assert fan.queries == ("Laptops report 1",)
    # a question it has no answer for falls back, never invents one
    assert HyDE(llm).transform("An unknown question?").fallback


def test_the_oracle_prefers_the_longest_question_a_prompt_contains() -> None:
    llm = OracleLLM(answers={"laptops": "short", "laptops at home": "long"})
    assert llm.complete("Question: laptops at home\nPassage:").text == "long"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("oracle", "oracle:1.0"),
        ("oracle:", "oracle:1.0"),
        ("oracle:x", "number from 0 to 1"),
        ("oracle:1.5", "between 0 and 1"),
        ("oracle:nan", "between 0 and 1"),
        ("oracle:0.5:x", "the draws"),
        ("oracle:0.5:21", "the draws"),
    ],
)
def test_a_bad_stand_in_spec_is_a_clear_error(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StandIn.parse(spec)


def test_other_model_names_are_not_the_stand_in() -> None:
    assert StandIn.parse("local") is None and StandIn.parse("openai:gpt-4o") is None
    assert StandIn.parse("oracle:0.5:2", base_seed=5) == StandIn(0.5, (5, 6))
    assert StandIn.parse("oracle:1") == StandIn(1.0, (0, 1, 2))


class CountingEmbedding(DeterministicEmbedding):
    """Counts the document texts it embeds."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        object.__setattr__(self, "_texts", [])

    def _get_text_embedding(self, text: str) -> list[float]:
        self._texts.append(text)  # type: ignore[attr-defined]
        return super()._get_text_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [self._get_text_embedding(t) for t in texts]


def test_each_seed_searches_an_index_without_its_drawn_documents_built_without_embedding(
    tmp_path: Path,
) -> None:
    ds = dataset()
    embed = CountingEmbedding(dim=128)
    session = EvalSession(
        ds, embed_model=embed, embed_label="det-128", cache_root=tmp_path, top_k=50
    )
    embedded_once = len(embed._texts)  # type: ignore[attr-defined]
    assert embedded_once == len(ds.corpus)
    seen: list[tuple[set[str], set[str], dict[str, dict[str, int]]]] = []

    def score_all(child: EvalSession, llm_for: Any) -> list[Any]:
        gone, found = _drawn_and_found(ds, child)
        seen.append((gone, found, child.ds.qrels))
        assert isinstance(llm_for("hyde"), OracleLLM)
        return [child.score("none", _none())]

    reports, info = run_standin(session, StandIn(0.5, (0, 1, 2)), score_all)
    session.close()
    assert len(seen) == 3 and info["seeds"] == [0, 1, 2]
    for gone, found, qrels in seen:
        assert gone and not gone & found  # the drawn documents are not in the index
        assert all(not gone & set(j) for j in qrels.values())
    assert len(embed._texts) == embedded_once  # type: ignore[attr-defined]
    assert reports[0].label == "none" and 0 < info["questions"] <= len(TOPICS)


def test_with_the_users_index_each_seed_still_searches_without_its_drawn_documents(
    tmp_path: Path,
) -> None:
    """``--index`` gives the session the user's index of the whole corpus; a seed's
    reduced set must still be searched in an index without its drawn documents."""
    from llama_index_hyde_plus.stores import FaissStore

    ds = dataset()
    embed = DeterministicEmbedding(dim=128)
    store = FaissStore(tmp_path / "my-index")
    docs = [Document(text=text, id_=d) for d, (_, text) in ds.corpus.items()]  # as --docs
    store.build(docs, embed, embed_spec="det", max_length=256)
    session = EvalSession(
        ds,
        embed_model=embed,
        embed_label="det-128",
        cache_root=tmp_path,
        top_k=50,
        index_store=store,
    )
    leaked: list[set[str]] = []

    def score_all(child: EvalSession, llm_for: Any) -> list[Any]:
        gone, found = _drawn_and_found(ds, child)
        leaked.append(gone & found)
        return [child.score("none", _none())]

    run_standin(session, StandIn(0.5, (0, 1)), score_all)
    session.close()
    assert leaked == [set(), set()]


def _drawn_and_found(ds: BeirDataset, child: EvalSession) -> tuple[set[str], set[str]]:
    """The documents a seed's reduced set lost, and those its questions retrieve."""
    gone = set(ds.corpus) - set(child.ds.corpus)
    found = {
        n.node.node_id
        for text in child.ds.queries.values()
        for n in child.base_retriever().retrieve(text)
    }
    return gone, found


def _none() -> Any:
    from llama_index_hyde_plus.transforms.registry import make_transform

    return make_transform("none", None)


def test_eval_with_the_stand_in_reports_its_rows_and_what_it_is(tmp_path: Path) -> None:
    ds = dataset()
    result = run_eval(
        ds,
        ["hyde:include_query=true", "multi-query:original_weight=1.0"],
        llm=None,
        standin=StandIn(1.0, (0, 1)),
        embed_model=DeterministicEmbedding(dim=128),
        embed_label="det-128",
        cache_root=tmp_path,
        top_k=20,
    )
    labels = [r.label for r in result.reports]
    assert labels == ["none", "hyde:include_query=true", "multi-query:original_weight=1.0"]
    assert "what a strong model could gain here" in result.config["stand_in"]
    assert result.config["right_share"] == 1.0
    hyde = result.reports[1]
    assert hyde.fallbacks == 0 and hyde.usage.calls == 2 * hyde.queries
    assert hyde.usage.cost_source == "local" and hyde.delta_vs_none is not None


def test_a_set_without_two_relevant_documents_per_question_is_a_clear_error(
    tmp_path: Path,
) -> None:
    ds = dataset()
    for qid in list(ds.qrels):
        first = next(iter(ds.qrels[qid]))
        ds.qrels[qid] = {first: 1}
    with pytest.raises(ValueError, match="at least two relevant documents"):
        run_eval(
            ds,
            ["hyde"],
            llm=None,
            standin=StandIn(1.0, (0,)),
            embed_model=DeterministicEmbedding(dim=64),
            embed_label="det-64",
            cache_root=tmp_path,
        )
