"""`run_eval`: score each transform over a BEIR dataset, in one `EvalSession`, and
compare it with `none` (or with the stand-in, `standin_run`).

The index is cached by corpus content and embedding model (`index_cache`), so a re-run
does not re-embed. Transform outputs go through a `SQLiteCache`, so a re-run, or a run
resumed after an interruption, makes no new LLM calls for the queries it already did.
The spec parsing (`specs`), the report types (`results`), the session (`session`) and
the stand-in's runs (`standin_run`) live in modules of their own; their names are
importable from here as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from llama_index.core.llms import LLM

from .beir import BeirDataset
from .index_cache import (
    ProgressFactory,
    cached_index,
    check_holds,
    corpus_index_name,
    eval_store,
    index_cache_dir,
)
from .results import EvalResult, TransformReport, compare, verdict
from .session import (
    SESSION_DEFAULTS,
    EvalSession,
    SessionOptions,
    build_transform,
    fresh_llm,
    needs_llm,
)
from .specs import TransformSpec, parse_transform_spec, split_transforms, with_none
from .standin import StandIn
from .standin_run import answer_kind, run_standin

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [  # the names this module held before it was split, still importable here
    "SESSION_DEFAULTS",
    "EvalResult",
    "EvalSession",
    "ProgressFactory",
    "SessionOptions",
    "TransformReport",
    "TransformSpec",
    "answer_kind",
    "build_transform",
    "cached_index",
    "check_holds",
    "compare",
    "corpus_index_name",
    "eval_store",
    "fresh_llm",
    "index_cache_dir",
    "needs_llm",
    "parse_transform_spec",
    "run_eval",
    "run_standin",
    "split_transforms",
    "verdict",
    "with_none",
]


def _score(
    session: EvalSession,
    spec: TransformSpec,
    llm: LLM | Callable[[], LLM] | None,
    hyde_prompt: str | None,
) -> TransformReport:
    """One transform's report; a factory gives each transform a fresh LLM, so seeded
    sampling does not depend on which transforms ran before in this process."""
    model = fresh_llm(llm) if needs_llm(spec.name) else None
    warm_up = getattr(model, "warm_up", None)
    if callable(warm_up):
        warm_up()  # a local model loads outside the timings
    transformer = build_transform(spec, model, session.cache, hyde_prompt)
    return session.score(spec.label, transformer, options=spec.options)


def run_eval(
    ds: BeirDataset,
    transforms: Sequence[str | TransformSpec],
    *,
    llm: LLM | Callable[[], LLM] | None,
    hyde_prompt: str | None = None,
    config: dict[str, Any] | None = None,
    standin: StandIn | None = None,
    **options: Unpack[SessionOptions],
) -> EvalResult:
    """Evaluate each transform in ``transforms`` on ``ds`` (see module docstring).

    ``llm`` is an LLM, or a zero-argument factory called once per transform (the CLI
    passes one so that each transform samples from a fresh, seeded local model).
    ``hyde_prompt`` is a HyDE paper prompt by task or a template; ``config`` is recorded
    in the report; ``standin`` scores with the strong-generator stand-in instead of
    ``llm`` (`run_standin`); ``options`` are the `EvalSession` options (`SessionOptions`).
    """
    specs = [t if isinstance(t, TransformSpec) else parse_transform_spec(t) for t in transforms]
    if not specs:
        raise ValueError("transforms must name at least one transform")
    if llm is None and standin is None and any(needs_llm(s.name) for s in specs):
        raise ValueError("an llm is needed for transforms other than none and rocchio")
    wall = time.perf_counter()
    session = EvalSession(ds, **options)
    phases = {"index": time.perf_counter() - wall}
    extra: dict[str, Any] = {}
    try:
        if standin is None:
            reports = []
            for spec in specs:
                start = time.perf_counter()
                reports.append(_score(session, spec, llm, hyde_prompt))
                phases[spec.label] = time.perf_counter() - start
            compare(reports)
        else:
            specs = with_none(specs)

            def score_all(child: EvalSession, llm_for: Callable[[str], Any]) -> list[Any]:
                return [_score(child, s, partial(llm_for, s.name), hyde_prompt) for s in specs]

            start = time.perf_counter()
            reports, extra = run_standin(session, standin, score_all)
            phases["stand-in runs"] = time.perf_counter() - start
    finally:
        session.close()
    return session.result(ds.name, reports, phases, wall, {**(config or {}), **extra})
