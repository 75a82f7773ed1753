"""A strong-generator stand-in for ``eval`` and ``tune`` (``--llm oracle:P``).

No strong LLM runs offline, so this measures what one could gain: on a labelled set
the "LLM" answers each question with the first ~400 characters of one of the
question's judged-relevant documents with probability ``P`` (a model that is right),
else of a judged-non-relevant document among the question's own top 30 plain-search
hits (a plausible, wrong answer). The fan-out transforms (multi-query, step-back,
decompose, rewrite) get that document's **title** as their one generated query (a
query in the corpus's own words); a set without titles gets the document's first
sentence.

The drawn documents are removed from the index (a copy built from the stored vectors:
nothing is embedded again) and from every judgement, so nothing is scored on text the
"generator" was given, and no signal can match a passage to its own document. Only
questions with at least two relevant documents take part (one is drawn, the others are
scored). Every seed draws anew; reports average each question's scores over the seeds.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llama_index.core.schema import NodeWithScore, TextNode
from pydantic import Field

from .._checks import is_number
from ..echo import PromptLLM
from ..transforms.parsing import trim_passage
from ..usage import sum_usage
from .beir import BeirDataset

ORACLE_PREFIX = "oracle"
DEFAULT_SEEDS = 3
PASSAGE_CHARACTERS = 400
WRONG_DEPTH = 30
"""A wrong answer is a judged-non-relevant document among the question's top 30."""

Kind = str  # "passage" (HyDE) or "query" (a fan-out's generated query)


@dataclass(frozen=True)
class StandIn:
    """A stand-in generator that is right with probability ``p``, drawn with each of
    ``seeds``."""

    p: float
    seeds: tuple[int, ...] = (0, 1, 2)
    characters: int = PASSAGE_CHARACTERS
    depth: int = WRONG_DEPTH

    def __post_init__(self) -> None:
        if not is_number(self.p):
            raise TypeError("the stand-in's P must be a number")
        if not 0.0 <= float(self.p) <= 1.0:  # NaN fails too
            raise ValueError(f"the stand-in's P must be between 0 and 1, not {self.p}")
        if not self.seeds:
            raise ValueError("the stand-in needs at least one seed")

    @classmethod
    def parse(cls, spec: str, *, base_seed: int = 0) -> StandIn | None:
        """``oracle:P`` or ``oracle:P:N`` -> a `StandIn` over ``N`` (default 3) seeds
        from ``base_seed``; any other model name -> None. A `ValueError` says what is
        wrong with ``P`` or ``N``."""
        head, sep, rest = spec.strip().partition(":")
        if head.lower() != ORACLE_PREFIX:
            return None
        value, _, count = rest.partition(":")
        if not sep or not value.strip():
            raise ValueError(
                "--llm oracle needs the share of right answers: oracle:1.0 or oracle:0.5"
            )
        try:
            p = float(value)
        except ValueError:
            raise ValueError(f"--llm oracle:P needs a number from 0 to 1, not {value!r}") from None
        seeds = int(count) if count.strip().isdigit() else -1 if count.strip() else DEFAULT_SEEDS
        if not 1 <= seeds <= 20:
            raise ValueError(f"oracle:P:N needs N, the draws, from 1 to 20, not {count!r}")
        return cls(p, tuple(range(base_seed, base_seed + seeds)))

    @property
    def label(self) -> str:
        """How `eval` names the stand-in: ``oracle:<p>``."""
        return f"{ORACLE_PREFIX}:{self.p:g}"

    def describe(self) -> str:
        """What the stand-in stands for, in words."""
        if self.p >= 1.0:
            what = "what a strong model could gain here"
        elif self.p == 0.5:
            what = "a model right half the time"
        elif self.p <= 0.0:
            what = "a model that is always wrong"
        else:
            what = f"a model right {self.p:.0%} of the time"
        return (
            f"stand-in generator ({self.label}): {what}. Each answer is a judged-relevant "
            f"document (P = {self.p:g}) or a judged-non-relevant one from the question's top "
            f"{self.depth}; the drawn documents are removed from the index and the judgements; "
            f"only questions with 2+ relevant documents; {len(self.seeds)} seed(s) averaged"
        )


@dataclass(frozen=True)
class Draw:
    """The document the stand-in answers one question with, and whether it is right."""

    doc_id: str
    right: bool


def eligible(ds: BeirDataset) -> list[str]:
    """Query ids with at least two judged-relevant documents (grade > 0), in order."""
    return [
        qid for qid in ds.queries if sum(1 for g in ds.qrels.get(qid, {}).values() if g > 0) >= 2
    ]


def draw(
    ds: BeirDataset,
    rankings: Mapping[str, Sequence[str]],
    p: float,
    seed: int,
    *,
    depth: int = WRONG_DEPTH,
) -> dict[str, Draw]:
    """One answer document per eligible question: a relevant one with probability
    ``p``, else a non-relevant one from the question's top ``depth`` in ``rankings``
    (plain search).

    Drawn documents leave the index and every judgement, and SciFact's claims share
    documents, so questions are drawn in a seeded random order and a document is only
    drawn when every question drawn so far (this one included) keeps a relevant
    document to be scored on. A question with no such candidate is left out (it is
    never given a right answer in place of a wrong one, nor the reverse)."""
    rng = random.Random(f"hyde-plus-oracle|{seed}")
    order = eligible(ds)
    rng.shuffle(order)
    left = {q: {d for d, g in ds.qrels[q].items() if g > 0} for q in order}
    chosen: dict[str, Draw] = {}
    for qid in order:
        judged = ds.qrels[qid]
        right = rng.random() < p
        if right:
            pool = sorted(left[qid])
        else:
            pool = [d for d in list(rankings.get(qid, ()))[:depth] if judged.get(d, 0) <= 0]
        keep = [*chosen, qid]
        pool = [d for d in pool if all(left[q] - {d} for q in keep)]
        if not pool:
            continue
        doc = rng.choice(pool)
        chosen[qid] = Draw(doc, right)
        for relevant in left.values():
            relevant.discard(doc)
    return {q: chosen[q] for q in eligible(ds) if q in chosen}


def reduced(ds: BeirDataset, draws: Mapping[str, Draw]) -> BeirDataset:
    """``ds`` for one draw: only the drawn questions, every drawn document gone from the
    corpus and from every judgement; a question left with no relevant document drops."""
    gone = {d.doc_id for d in draws.values()}
    qrels: dict[str, dict[str, int]] = {}
    for qid in draws:
        kept = {d: g for d, g in ds.qrels.get(qid, {}).items() if d not in gone}
        if any(g > 0 for g in kept.values()):
            qrels[qid] = kept
    key = hashlib.sha256(f"{ds.corpus_sha256}|without|{','.join(sorted(gone))}".encode())
    return BeirDataset(
        name=ds.name,
        corpus={d: v for d, v in ds.corpus.items() if d not in gone},
        queries={q: t for q, t in ds.queries.items() if q in qrels},
        qrels=qrels,
        corpus_sha256=key.hexdigest(),
        titled=ds.titled,
    )


_SENTENCE = re.compile(r"(?<=[.!?])\s")


def answer_text(
    ds: BeirDataset, doc_id: str, kind: Kind, characters: int = PASSAGE_CHARACTERS
) -> str:
    """What the stand-in writes: a passage (the document's first ``characters``,
    trimmed at a boundary) or a query (its title, else its first sentence)."""
    title, text = ds.corpus[doc_id]
    if kind == "query":
        query = title.strip() or _SENTENCE.split(text.strip(), maxsplit=1)[0]
        return trim_passage(" ".join(query.split()), characters)
    return trim_passage(" ".join(ds.document_text(doc_id).split()), characters)


class OracleLLM(PromptLLM):
    """The stand-in as a LlamaIndex LLM: it finds which question a prompt is about
    (the longest known question the prompt contains) and answers with its drawn text.
    A prompt about no known question raises, so the transform falls back. Costs
    nothing: reported as a local model's $0."""

    answers: dict[str, str] = Field(default_factory=dict)
    model_name: str = Field(default="oracle")

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's serialisation name of this class."""
        return "OracleLLM"

    def reply(self, prompt: str) -> str:
        """The drawn answer of the longest question found in ``prompt``; a `ValueError`
        (so the transform falls back) when the prompt holds none of them."""
        for question in sorted(self.answers, key=len, reverse=True):
            if question and question in prompt:
                return self.answers[question]
        raise ValueError("the stand-in has no answer for this prompt")


def oracle_llm(
    ds: BeirDataset, draws: Mapping[str, Draw], kind: Kind, *, characters: int, label: str
) -> OracleLLM:
    """The stand-in LLM for one draw: each drawn question answered with its text
    (``ds`` is the full set: the drawn documents are gone from the reduced one)."""
    answers = {
        ds.queries[qid]: answer_text(ds, d.doc_id, kind, characters) for qid, d in draws.items()
    }
    return OracleLLM(answers=answers, model_name=f"{label}:{kind}")


def stored_vectors(
    retriever: Any, doc_ids: Sequence[str], batch: int = 512
) -> dict[str, list[float]]:
    """The vectors the index already holds for ``doc_ids`` (FAISS or Milvus), so a
    reduced copy is built without embedding anything again."""
    from ..search.vectors import DocVectors

    reader = DocVectors(retriever, None, max_entries=1)
    out: dict[str, list[float]] = {}
    for start in range(0, len(doc_ids), batch):
        ids = list(doc_ids[start : start + batch])
        nodes = [NodeWithScore(node=TextNode(id_=i), score=0.0) for i in ids]
        out.update(zip(ids, reader.get(nodes), strict=True))
    return out


def plain_rankings(retriever: Any, ds: BeirDataset, qids: Sequence[str]) -> dict[str, list[str]]:
    """The question's own plain-search ranking (node ids) for each of ``qids``."""
    return {qid: [n.node.node_id for n in retriever.retrieve(ds.queries[qid])] for qid in qids}


@dataclass
class SeedRun:
    """What one seed's draw scored: the reports (``none`` first) and the draw."""

    reports: list[Any]
    draws: dict[str, Draw] = field(default_factory=dict)


def merge_seeds(runs: Sequence[SeedRun]) -> list[Any]:
    """One `TransformReport` per label over every seed: each question's nDCG@10 is the
    mean of its seeds (a question in fewer seeds averages those), scores are the mean
    over seeds, counts add up. Comparisons are left to `compare`."""
    if not runs:
        return []
    merged = []
    for i, first in enumerate(runs[0].reports):
        same = [run.reports[i] for run in runs]
        per_query: dict[str, list[float]] = {}
        for report in same:
            for qid, value in report.per_query_ndcg.items():
                per_query.setdefault(qid, []).append(value)
        scores = {k: sum(r.scores[k] for r in same) / len(same) for k in first.scores}
        merged.append(
            replace(
                first,
                scores=scores,
                per_query_ndcg={q: sum(v) / len(v) for q, v in per_query.items()},
                usage=sum_usage([r.usage for r in same]),
                fallbacks=sum(r.fallbacks for r in same),
                cached=sum(r.cached for r in same),
                queries=len(per_query),
                skipped=sum(r.skipped for r in same),
                latency_n=sum(r.latency_n for r in same),
                rankings={f"{n}|{q}": r for n, x in enumerate(same) for q, r in x.rankings.items()},
            )
        )
    return merged


def right_share(runs: Sequence[SeedRun]) -> float:
    """The share of drawn answers that were right, over every seed."""
    draws = [d for run in runs for d in run.draws.values()]
    return sum(d.right for d in draws) / len(draws) if draws else 0.0


ScoreAll = Callable[[Any, Callable[[str], Any]], list[Any]]
"""``score_all(session, llm_for)``: score every configuration on one seed's session;
``llm_for(transform_name)`` is the stand-in LLM that transform should use."""
