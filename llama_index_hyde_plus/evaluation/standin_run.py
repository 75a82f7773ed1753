"""Scoring with the strong-generator stand-in (`standin`): one reduced session per
seed, its reports averaged per question over the seeds and compared with `none`."""

from __future__ import annotations

from typing import Any

from ..transforms._listing import QueryListTransform
from ..transforms.registry import transform_class
from .results import TransformReport, compare
from .session import EvalSession
from .standin import (
    Draw,
    ScoreAll,
    SeedRun,
    StandIn,
    draw,
    eligible,
    merge_seeds,
    oracle_llm,
    plain_rankings,
    reduced,
    right_share,
    stored_vectors,
)


def answer_kind(name: str) -> str:
    """What a stand-in writes for the transform ``name``: generated queries for a
    fan-out (a `QueryListTransform`), else a passage."""
    return "query" if issubclass(transform_class(name), QueryListTransform) else "passage"


def run_standin(
    session: EvalSession, standin: StandIn, score_all: ScoreAll
) -> tuple[list[TransformReport], dict[str, Any]]:
    """Score with the stand-in generator (`standin` module): for each seed, draw the
    answers, build the reduced index from ``session``'s stored vectors, and call
    ``score_all(reduced session, llm_for)`` (its reports, ``none`` first); the reports
    are averaged per question over the seeds and compared with ``none``. Returns the
    reports and what to record about the stand-in."""
    ds = session.ds
    qids = eligible(ds)
    if not qids:
        raise ValueError(
            "--llm oracle needs questions with at least two relevant documents "
            "(one is given to the stand-in, the others are scored); this set has none"
        )
    retriever = session.base_retriever()
    rankings = plain_rankings(retriever, ds, qids)
    vectors = stored_vectors(retriever, list(ds.corpus))
    runs: list[SeedRun] = []
    for seed in standin.seeds:
        draws = draw(ds, rankings, standin.p, seed, depth=standin.depth)
        sub = reduced(ds, draws)
        tag = f"{standin.label}:seed={seed}"

        def llm_for(name: str, draws: dict[str, Draw] = draws, tag: str = tag) -> Any:
            kind = answer_kind(name)  # the text comes from the full corpus
            return oracle_llm(ds, draws, kind, characters=standin.characters, label=tag)

        child = session.derived(sub, vectors)
        try:
            runs.append(SeedRun(score_all(child, llm_for), draws))
        finally:
            child.close()
    reports = merge_seeds(runs)
    compare(reports)
    info = {
        "stand_in": standin.describe(),
        "p": standin.p,
        "seeds": list(standin.seeds),
        "questions": reports[0].queries if reports else 0,
        "eligible_questions": len(qids),
        "right_share": round(right_share(runs), 4),
    }
    return reports, info
