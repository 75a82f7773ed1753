"""Scoring on a conversational set (`conversational`): the message as written, a
person's rewrite of it, and each transform searched with the chat before the message
(`Condense`), on the follow-up turns, compared with the message as written.

Turns of one conversation are not independent (one topic, one writer), so the 95%
intervals and p-values resample whole conversations (`conversation_interval`), not
turns. The stand-in (``--llm oracle:P``) writes the person's rewrite with probability
``P``, else the person's rewrite of another turn of the same conversation (a condense
that drifted to the wrong part of the chat); its runs are averaged per turn over its
seeds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.llms import LLM
from pydantic import Field

from ..echo import PromptLLM
from ..transforms.condense import _lines, read_messages
from .conversational import ConversationalSet, Turn
from .results import EvalResult, TransformReport
from .session import EvalSession, SessionOptions, build_transform, fresh_llm, needs_llm
from .specs import TransformSpec
from .standin import SeedRun, StandIn, merge_seeds

if TYPE_CHECKING:
    from typing_extensions import Unpack

AS_WRITTEN = "as written"
HUMAN_REWRITE = "human rewrite"
RESAMPLES = 2000


def conversation_interval(
    a: Mapping[str, float],
    b: Mapping[str, float],
    conversations: Mapping[str, str],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(low, high, p)``: the 95% bootstrap interval of the mean per-turn difference
    ``a - b``, resampling whole conversations (each turn's conversation in
    ``conversations``), and the two-sided bootstrap p-value (twice the smaller share of
    resampled means on either side of 0, at most 1). NaNs below 2 conversations."""
    by_conversation: dict[str, list[float]] = {}
    for key in sorted(set(a) & set(b)):
        by_conversation.setdefault(conversations[key], []).append(a[key] - b[key])
    groups = [(sum(v), len(v)) for _, v in sorted(by_conversation.items())]
    if len(groups) < 2:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(f"hyde-plus-conversations|{seed}")
    means = []
    for _ in range(resamples):
        picked = [groups[rng.randrange(len(groups))] for _ in groups]
        means.append(sum(s for s, _ in picked) / sum(n for _, n in picked))
    means.sort()
    low = means[int(0.025 * resamples)]
    high = means[min(resamples - 1, int(0.975 * resamples))]
    below = sum(m <= 1e-12 for m in means)
    above = sum(m >= -1e-12 for m in means)
    return low, high, min(1.0, 2 * min(below, above) / resamples)


def compare_conversations(reports: Sequence[TransformReport], cset: ConversationalSet) -> None:
    """Compare every report with the first (the message as written): wins, ties,
    losses and difference per turn, with the interval and p over conversations."""
    if not reports:
        return
    baseline, conversations = reports[0], cset.conversations()
    for report in reports[1:]:
        report.compare_with(baseline)
        low, high, p = conversation_interval(
            report.per_query_ndcg, baseline.per_query_ndcg, conversations
        )
        report.interval_vs_none = (low, high)
        report.p_value_vs_none = p


class ConversationOracleLLM(PromptLLM):
    """The conversational stand-in as a LlamaIndex LLM: it finds which turn a condense
    prompt is about and answers with the rewrite drawn for it. A turn is the one asked
    about when its message ends a line of the prompt that is not a chat line (the
    ``User:`` / ``Assistant:`` lines hold the earlier messages, which are other turns'
    messages) and the prompt's last chat line starts as the turn's last chat line does
    (what tells apart two turns with the same words, in one conversation or two); among
    several, the longest message. A prompt about no known turn raises, so the transform
    falls back. Costs nothing."""

    answers: list[tuple[tuple[str, ...], str]] = Field(default_factory=list)
    model_name: str = Field(default="oracle")

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's serialisation name of this class."""
        return "ConversationOracleLLM"

    def reply(self, prompt: str) -> str:
        """The drawn rewrite of the turn the prompt is about; a `ValueError` when none."""
        lines = [" ".join(line.split()) for line in prompt.splitlines()]
        chat = [line for line in lines if line.startswith(_CHAT_LINES)]
        asked = [line for line in lines if not line.startswith(_CHAT_LINES)]
        last = chat[-1] if chat else ""
        found = [
            (len(parts[0]), text)
            for parts, text in self.answers
            if _asks(asked, parts[0]) and last.startswith("".join(parts[1:]))
        ]
        if not found:
            raise ValueError("the stand-in has no answer for this prompt")
        return max(found)[1]


_CHAT_LINES = ("User: ", "Assistant: ")
SIGNATURE_CHARACTERS = 120
"""How much of a turn's last chat line the stand-in looks for: its start, which the
history bound keeps even when it cuts the line at its end."""


def _asks(lines: Sequence[str], message: str) -> bool:
    """Whether one of ``lines`` ends with ``message`` as whole words."""
    message = " ".join(message.split())
    return any(
        line == message or (line.endswith(message) and not line[-len(message) - 1].isalnum())
        for line in lines
    )


def _signature(turn: Turn) -> tuple[str, ...]:
    """What a condense prompt for ``turn`` holds: the message, and the start of the
    last chat line."""
    lines = _lines(read_messages(list(turn.history)))
    return (turn.message, *(line[:SIGNATURE_CHARACTERS].rstrip() for line in lines[-1:]))


def draw_rewrites(turns: Sequence[Turn], p: float, seed: int) -> dict[str, tuple[str, bool]]:
    """Per follow-up turn, ``(rewrite, right)``: its own rewrite with probability ``p``,
    else the rewrite of another turn of its conversation with other relevant
    documents (of another conversation when its own has none)."""
    rng = random.Random(f"hyde-plus-conversation-oracle|{seed}")
    drawn: dict[str, tuple[str, bool]] = {}
    for turn in turns:
        if not turn.follow_up:
            continue
        if rng.random() < p:
            drawn[turn.qid] = (turn.rewrite, True)
            continue
        others = [t for t in turns if set(t.relevant).isdisjoint(turn.relevant)]
        same = [t for t in others if t.conversation == turn.conversation]
        pool = same or others
        if pool:
            drawn[turn.qid] = (rng.choice(pool).rewrite, False)
    return drawn


def oracle_for(cset: ConversationalSet, standin: StandIn, seed: int) -> ConversationOracleLLM:
    """The stand-in LLM of one seed's draw."""
    by_id = {t.qid: t for t in cset.turns}
    drawn = draw_rewrites(cset.turns, standin.p, seed)
    answers = [(_signature(by_id[q]), text) for q, (text, _) in drawn.items()]
    return ConversationOracleLLM(answers=answers, model_name=f"{standin.label}:seed={seed}")


def _score_standin(
    session: EvalSession, spec: TransformSpec, cset: ConversationalSet, standin: StandIn
) -> TransformReport:
    """``spec`` with the stand-in, once per seed (never cached), averaged per turn."""
    runs = []
    for seed in standin.seeds:
        transformer = build_transform(spec, oracle_for(cset, standin, seed), None, None)
        report = session.score(
            spec.label, transformer, options=spec.options, chats=cset.histories()
        )
        runs.append(SeedRun([report]))
    merged: TransformReport = merge_seeds(runs)[0]
    merged.label = f"{spec.label} ({standin.label})"
    merged.rankings = runs[0].reports[0].rankings  # the first draw's, to count changes
    return merged


def _score_model(
    session: EvalSession,
    spec: TransformSpec,
    cset: ConversationalSet,
    llm: LLM | Callable[[], LLM] | None,
    hyde_prompt: str | None,
) -> TransformReport:
    model = fresh_llm(llm) if needs_llm(spec.name) else None
    warm_up = getattr(model, "warm_up", None)
    if callable(warm_up):
        warm_up()  # a local model loads outside the timings
    transformer = build_transform(spec, model, session.cache, hyde_prompt)
    return session.score(spec.label, transformer, options=spec.options, chats=cset.histories())


def run_conversations(
    cset: ConversationalSet,
    specs: Sequence[TransformSpec],
    *,
    llm: LLM | Callable[[], LLM] | None,
    standin: StandIn | None = None,
    config: dict[str, Any] | None = None,
    hyde_prompt: str | None = None,
    **options: Unpack[SessionOptions],
) -> EvalResult:
    """Score the follow-up turns of ``cset``: the message as written, the human
    rewrite, then each of ``specs`` (``none`` is the message as written and is not
    repeated) with each turn's chat, with ``llm`` or the stand-in; compared with the
    message as written over conversations (`compare_conversations`). ``hyde_prompt``
    picks HyDE's prompt, as in `run_eval`."""
    ds = cset.as_beir("message")
    if not ds.queries:
        raise ValueError(f"{cset.name}: no follow-up turns (every turn starts its chat)")
    specs = [s for s in specs if s.name != "none"]
    if llm is None and standin is None and any(needs_llm(s.name) for s in specs):
        raise ValueError("an llm is needed for transforms other than none and rocchio")
    wall = time.perf_counter()
    session = EvalSession(ds, **options)
    phases = {"index": time.perf_counter() - wall}
    plain = build_transform(TransformSpec("none", "none"), None, None, None)
    try:
        reports = [session.score(AS_WRITTEN, plain)]
        rewrites = cset.as_beir("rewrite").queries
        reports.append(session.score(HUMAN_REWRITE, plain, queries=rewrites))
        for spec in specs:
            start = time.perf_counter()
            if standin is not None and needs_llm(spec.name):
                reports.append(_score_standin(session, spec, cset, standin))
            else:
                reports.append(_score_model(session, spec, cset, llm, hyde_prompt))
            phases[reports[-1].label] = time.perf_counter() - start
    finally:
        session.close()
    compare_conversations(reports, cset)
    return _result(cset, ds, reports, session, phases, wall, config, standin)


def _result(
    cset: ConversationalSet,
    ds: Any,
    reports: list[TransformReport],
    session: EvalSession,
    phases: dict[str, float],
    wall: float,
    config: dict[str, Any] | None,
    standin: StandIn | None,
) -> EvalResult:
    conversations = {cset.conversations()[q] for q in ds.queries}
    extra = {
        "set": "conversational",
        "turns": f"{len(ds.queries)} follow-up turns of {len(conversations)} conversations "
        f"({len(cset.turns) - len(ds.queries)} first turns left out: nothing to condense)",
        "baseline": AS_WRITTEN,
        "intervals": f"bootstrap over conversations ({RESAMPLES} resamples)",
    }
    if standin is not None:
        extra["stand_in"] = (
            f"stand-in ({standin.label}): writes the human rewrite with P = {standin.p:g}, "
            "else the human rewrite of another turn of the same conversation; "
            f"{len(standin.seeds)} seed(s) averaged"
        )
    return session.result(cset.name, reports, phases, wall, {**(config or {}), **extra})


def share_kept(result: EvalResult, label: str) -> float:
    """How much of the human rewrite's gain over the message as written the report
    ``label`` keeps (1.0: all of it; NaN when the rewrite gains nothing)."""
    by_label = {r.label: r for r in result.reports}
    gain = by_label[HUMAN_REWRITE].delta_vs_none or 0.0
    mine = by_label[label].delta_vs_none or 0.0
    return mine / gain if gain > 1e-12 else float("nan")


__all__ = [
    "AS_WRITTEN",
    "HUMAN_REWRITE",
    "ConversationOracleLLM",
    "compare_conversations",
    "conversation_interval",
    "draw_rewrites",
    "run_conversations",
    "share_kept",
]
