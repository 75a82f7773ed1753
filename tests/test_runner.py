from __future__ import annotations

from pathlib import Path

import pytest

from llama_index_hyde_plus.evaluation import load_beir, parse_transform_spec, run_eval
from llama_index_hyde_plus.evaluation.runner import TransformSpec
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

TINY = Path(__file__).parent / "data" / "tiny-beir"
ANSWERS = {
    "Why did revenue drop?": "Revenue fell because enterprise renewals slipped when large "
    "accounts delayed signing.",
    "How many vacation days do staff get?": "Employees receive twenty five days of paid time off.",
    "Which security measures protect company laptops?": "Laptops use full disk encryption.",
}


def answering_llm() -> ScriptedLLM:
    def respond(prompt: str) -> str:
        return next(a for q, a in ANSWERS.items() if q in prompt)

    return ScriptedLLM(respond=respond, model_name="gpt-4o-mini")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("none", TransformSpec("none", "none", {})),
        ("hyde", TransformSpec("hyde", "hyde", {})),
        ("hyde-n4", TransformSpec("hyde-n4", "hyde", {"num_passages": 4})),
        ("hyde+q", TransformSpec("hyde+q", "hyde", {"include_query": True})),
        (
            "hyde-n4+q",
            TransformSpec("hyde-n4+q", "hyde", {"num_passages": 4, "include_query": True}),
        ),
        ("multi-query-n5", TransformSpec("multi-query-n5", "multi-query", {"n": 5})),
        (
            "hyde:num_passages=2,temperature=0.5,include_query=true",
            TransformSpec(
                "hyde:num_passages=2,temperature=0.5,include_query=true",
                "hyde",
                {"num_passages": 2, "temperature": 0.5, "include_query": True},
            ),
        ),
    ],
)
def test_transform_specs(spec: str, expected: TransformSpec) -> None:
    assert parse_transform_spec(spec) == expected


@pytest.mark.parametrize("spec", ["magic", "hyde:n", "HyDE!!"])
def test_bad_transform_specs_are_value_errors(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_transform_spec(spec)


def test_eval_scores_transforms_and_resumes_from_cache(tmp_path: Path) -> None:
    ds = load_beir(TINY)
    PAPER = "hyde:include_query=false"  # the paper's HyDE: the passage alone decides
    embed = DeterministicEmbedding(dim=256)
    llm = answering_llm()
    kwargs = dict(
        embed_model=embed, embed_label="det-256", cache_root=tmp_path, top_k=5, concurrency=2
    )
    first = run_eval(ds, ["none", PAPER, "hyde+q"], llm=llm, **kwargs)  # type: ignore[arg-type]
    reports = {r.label: r for r in first.reports}
    assert not first.index_cached
    assert reports[PAPER].scores["nDCG@10"] > reports["none"].scores["nDCG@10"]
    assert reports[PAPER].usage.calls == 3 and reports[PAPER].usage.cost > 0
    assert reports[PAPER].p_value_vs_none is not None
    assert reports["none"].p_value_vs_none is None and reports["none"].usage.calls == 0
    assert reports[PAPER].latency_n == 3 and reports[PAPER].fallbacks == 0
    assert reports["hyde+q"].cached == 3  # same passages: include_query is not in the key
    calls_after_first = len(llm.prompts)
    assert calls_after_first == 3

    second = run_eval(ds, ["none", PAPER], llm=llm, **kwargs)  # type: ignore[arg-type]
    assert second.index_cached and len(llm.prompts) == calls_after_first
    again = {r.label: r for r in second.reports}
    assert again[PAPER].cached == 3
    assert again[PAPER].scores == reports[PAPER].scores
    assert again[PAPER].usage.calls == 3  # the generation usage is still reported


def test_eval_reports_wins_ties_losses_a_verdict_and_the_rocchio_baseline(tmp_path: Path) -> None:
    ds = load_beir(TINY)
    result = run_eval(
        ds,
        ["none", "hyde:include_query=false", "rocchio"],
        llm=answering_llm(),
        embed_model=DeterministicEmbedding(dim=256),
        embed_label="det-256",
        cache_root=tmp_path,
        top_k=5,
    )
    none, paper, rocchio = result.reports
    assert none.delta_vs_none is None and none.verdict == "baseline"
    assert paper.wins + paper.ties + paper.losses == len(ds.queries)
    assert paper.delta_vs_none == pytest.approx(paper.scores["nDCG@10"] - none.scores["nDCG@10"])
    assert paper.verdict.startswith(("helps", "hurts", "no clear difference"))
    assert rocchio.usage.calls == 0 and rocchio.fallbacks == 0  # no LLM at all
    data = result.to_dict()["results"][1]
    assert {"wins", "ties", "losses", "verdict", "delta_ndcg@10_vs_none"} <= set(data)


def test_eval_counts_fallbacks(tmp_path: Path) -> None:
    ds = load_beir(TINY, limit=2)
    llm = ScriptedLLM([RuntimeError("down"), RuntimeError("down")])
    result = run_eval(
        ds,
        ["hyde"],
        llm=llm,
        embed_model=DeterministicEmbedding(),
        embed_label="det",
        cache_root=tmp_path,
        use_cache=False,
    )
    assert result.reports[0].fallbacks == 2


def test_eval_needs_an_llm_for_llm_transforms(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="llm"):
        run_eval(
            load_beir(TINY),
            ["hyde"],
            llm=None,
            embed_model=DeterministicEmbedding(),
            embed_label="det",
            cache_root=tmp_path,
        )


def test_split_transforms_keeps_several_options_of_one_transform_together() -> None:
    from llama_index_hyde_plus.evaluation.runner import split_transforms

    assert split_transforms("none, hyde:query_weight=0.8,gate=0.7,rocchio,hyde+q") == [
        "none",
        "hyde:query_weight=0.8,gate=0.7",
        "rocchio",
        "hyde+q",
    ]
    assert split_transforms("hyde:k=1,multi-query:original_weight=2,n=4") == [
        "hyde:k=1",
        "multi-query:original_weight=2,n=4",
    ]


def test_eval_flags_a_configuration_that_changes_nothing(tmp_path: Path) -> None:
    ds = load_beir(TINY)
    kwargs = dict(
        embed_model=DeterministicEmbedding(dim=256), embed_label="det-256", cache_root=tmp_path
    )
    result = run_eval(  # type: ignore[arg-type]
        ds,
        ["none", "hyde:query_weight=1.0,keyword_weight=1.0", "hyde:include_query=false"],
        llm=answering_llm(),
        **kwargs,
    )
    _, same, moved = result.reports
    assert same.identical_to_none and not moved.identical_to_none
    assert same.to_dict()["identical_to_none"] is True
    from llama_index_hyde_plus.evaluation.report import verdicts

    said = verdicts(result)
    assert "identical to none on every query" in said[0]
    assert "identical to none" not in said[1]


def test_a_cached_index_that_cannot_be_read_is_built_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ds = load_beir(TINY)
    kwargs = dict(embed_model=DeterministicEmbedding(dim=64), embed_label="det-64")
    first = run_eval(ds, ["none"], llm=None, cache_root=tmp_path, **kwargs)  # type: ignore[arg-type]
    [vector_store] = (tmp_path / "indexes").glob("*/current/default__vector_store.json")
    vector_store.write_bytes(vector_store.read_bytes()[:100])  # damaged
    with caplog.at_level("WARNING"):
        again = run_eval(ds, ["none"], llm=None, cache_root=tmp_path, **kwargs)  # type: ignore[arg-type]
    assert not again.index_cached and "building it again" in caplog.text
    assert again.reports[0].scores == first.reports[0].scores


def test_configurations_sharing_a_generation_are_scored_on_the_same_unusable_replies(
    tmp_path: Path,
) -> None:
    # the model's first reply to each question cannot be read, its next ones can: every
    # configuration that shares the generation, in this run and the next, falls back
    ds = load_beir(TINY)
    asked: dict[str, int] = {}

    def respond(prompt: str) -> str:
        question = next(q for q in ANSWERS if q in prompt)
        asked[question] = asked.get(question, 0) + 1
        return "Sure, here you are:" if asked[question] == 1 else f"1. {ANSWERS[question]}"

    llm = ScriptedLLM(respond=respond, model_name="gpt-4o-mini")
    configs = [
        "multi-query:n=1",
        "multi-query:n=1,original_weight=10",
        "multi-query:n=1,original_weight=1",
    ]
    kwargs = dict(embed_model=DeterministicEmbedding(dim=256), embed_label="det-256",
                  cache_root=tmp_path, top_k=5)  # fmt: skip
    first = run_eval(ds, configs, llm=llm, **kwargs)  # type: ignore[arg-type]
    assert [r.fallbacks for r in first.reports] == [3, 3, 3]
    assert [r.cached for r in first.reports] == [0, 3, 3]
    assert set(asked.values()) == {1}  # each question asked once in all
    again = run_eval(ds, configs[:1], llm=llm, **kwargs)  # type: ignore[arg-type]
    assert again.reports[0].fallbacks == 3 and again.reports[0].cached == 3
    assert set(asked.values()) == {1}
    fresh = run_eval(ds, configs[:1], llm=llm, **{**kwargs, "use_cache": False})  # type: ignore[arg-type]
    assert fresh.reports[0].fallbacks == 0  # without the cache, asked again


def test_a_generation_whose_call_failed_is_asked_again_in_the_next_configuration(
    tmp_path: Path,
) -> None:
    ds = load_beir(TINY, limit=1)
    llm = ScriptedLLM([RuntimeError("down"), "1. Enterprise renewals slipped."])
    configs = ["multi-query:n=1", "multi-query:n=1,original_weight=10"]
    result = run_eval(ds, configs, llm=llm, embed_model=DeterministicEmbedding(),
                      embed_label="det", cache_root=tmp_path)  # fmt: skip
    assert [r.fallbacks for r in result.reports] == [1, 0]


def test_a_data_set_with_a_name_near_the_file_name_limit_gets_an_index_cache_folder(
    tmp_path: Path,
) -> None:
    from llama_index_hyde_plus.evaluation.beir import BeirDataset
    from llama_index_hyde_plus.evaluation.index_cache import corpus_index_name, index_cache_dir

    def named(name: str) -> BeirDataset:
        return BeirDataset(name, {"d": ("", "text")}, {"q": "?"}, {"q": {"d": 1}}, "ab" * 32)

    long_name = "L" * 250  # a legal folder name: the cache's own name must stay legal
    folder = index_cache_dir(named(long_name), "det", tmp_path)
    folder.mkdir(parents=True)
    (folder / "hyde_plus.json").write_text("{}")
    assert corpus_index_name(named("scifact"), "det").startswith("scifact-")  # as before
