"""The conversational evaluation: its format, QReCC conversion, intervals over
conversations, the stand-in, and `run_conversations` with the chat reaching Condense."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from llama_index_hyde_plus.evaluation.conversational import (
    ConversationalFormatError,
    from_qrecc,
    is_conversational,
    load_conversations,
)
from llama_index_hyde_plus.evaluation.conversational_run import (
    AS_WRITTEN,
    HUMAN_REWRITE,
    ConversationOracleLLM,
    conversation_interval,
    draw_rewrites,
    oracle_for,
    run_conversations,
    share_kept,
)
from llama_index_hyde_plus.evaluation.metrics import paired_interval
from llama_index_hyde_plus.evaluation.specs import TransformSpec
from llama_index_hyde_plus.evaluation.standin import StandIn
from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM
from llama_index_hyde_plus.transforms.condense import Condense

CORPUS = {
    "pa": "A physician assistant is a licensed medical provider who diagnoses illness.",
    "pa-cost": "Physician assistant school tuition costs about 71,000 dollars in total.",
    "goat": "The Boer goat breed was developed in South Africa for meat.",
    "goat-fibre": "Angora goats are kept for mohair fibre rather than for meat.",
    "nurse": "A registered nurse studies anatomy, physiology and chemistry.",
}


def turn(conv: str, n: int, message: str, rewrite: str, relevant: list[str], history: Any = ()):
    return {
        "conversation": conv,
        "turn": n,
        "message": message,
        "history": list(history),
        "rewrite": rewrite,
        "relevant": relevant,
    }


def chat(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    out = []
    for question, answer in pairs:
        out += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return out


TURNS = [
    turn("pa", 1, "What is a physician assistant?", "What is a physician assistant?", ["pa"]),
    turn(
        "pa",
        2,
        "What does it cost?",
        "What does physician assistant school cost?",
        ["pa-cost"],
        chat(("What is a physician assistant?", CORPUS["pa"])),
    ),
    turn("goat", 1, "Tell me about Boer goats", "Tell me about Boer goats", ["goat"]),
    turn(
        "goat",
        2,
        "Are angora ones good for it?",
        "Are angora goats good for meat?",
        ["goat-fibre"],
        chat(("Tell me about Boer goats", CORPUS["goat"])),
    ),
    turn(
        "goat",
        3,
        "What does it cost?",
        "What does a Boer goat cost?",
        ["goat"],
        chat(("Tell me about Boer goats", CORPUS["goat"]), ("Are angora ones good?", "No.")),
    ),
]


def write_set(root: Path, turns: list[dict[str, Any]], split: str = "test") -> Path:
    (root / "turns").mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"_id": d, "text": t}) for d, t in CORPUS.items()]
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    (root / "turns" / f"{split}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    return root


def test_a_conversational_set_loads_its_turns_and_follow_ups(tmp_path: Path) -> None:
    root = write_set(tmp_path / "set", TURNS)
    assert is_conversational(root) and not is_conversational(tmp_path)
    cset = load_conversations(root)
    assert len(cset.turns) == 5 and set(cset.queries) == {"pa#2", "goat#2", "goat#3"}
    beir = cset.as_beir("rewrite")
    assert beir.queries["pa#2"] == "What does physician assistant school cost?"
    assert beir.qrels["goat#3"] == {"goat": 1} and beir.corpus_sha256 == cset.corpus_sha256
    assert cset.histories()["pa#2"][0] == {"role": "user", "content": TURNS[0]["message"]}
    assert cset.conversations()["goat#3"] == "goat"


def test_limit_keeps_whole_conversations(tmp_path: Path) -> None:
    root = write_set(tmp_path / "set", TURNS)
    assert [t.qid for t in load_conversations(root, limit=1).turns] == ["pa#1", "pa#2"]
    assert len(load_conversations(root, limit=3).turns) == 5


BAD = [
    ({"turn": 0}, "'turn' must be an integer"),
    ({"turn": "2"}, "'turn' must be an integer"),
    ({"turn": True}, "'turn' must be an integer"),
    ({"message": "  "}, "'message' must be a non-empty string"),
    ({"message": None}, "'message' must be a non-empty string"),
    ({"rewrite": ["x"]}, "'rewrite' must be a non-empty string"),
    ({"conversation": ""}, "'conversation' must be a non-empty string"),
    ({"history": "User: hi"}, "history must be a list of chat messages"),
    ({"history": [{"role": "system", "content": "x"}]}, "history[0].role"),
    ({"history": [{"role": "user", "content": 3}]}, "history[0].content"),
    ({"message": "cost \ud800?"}, "'message' must be valid Unicode text"),
    ({"history": [{"role": "user", "content": "\udfff"}]}, "history[0].content must be valid"),
    ({"relevant": []}, "'relevant' must be a non-empty list"),
    ({"relevant": "pa"}, "'relevant' must be a non-empty list"),
    ({"relevant": ["nowhere"]}, "'relevant' names 'nowhere', not in corpus"),
    ({"relevant": [7]}, "'relevant' names 7"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_a_bad_turn_names_the_file_line_and_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    root = write_set(tmp_path / "set", [TURNS[0], {**TURNS[1], **change}])
    with pytest.raises(ConversationalFormatError) as err:
        load_conversations(root)
    assert "test.jsonl:2" in str(err.value) and message in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"conversation": "a"}\n', "missing field(s)"),
        ("not json\n", "not valid JSON"),
        ("[1, 2]\n", "expected a JSON object"),
        ("\n", "is empty"),
    ],
)
def test_a_malformed_line_is_an_error_naming_it(tmp_path: Path, text: str, message: str) -> None:
    root = write_set(tmp_path / "set", TURNS)
    (root / "turns" / "test.jsonl").write_text(text)
    with pytest.raises(ConversationalFormatError) as err:
        load_conversations(root)
    assert message in str(err.value)


def test_a_turn_listed_twice_and_a_missing_split_are_errors(tmp_path: Path) -> None:
    root = write_set(tmp_path / "set", [TURNS[0], TURNS[1], TURNS[1]])
    with pytest.raises(ConversationalFormatError, match=r"listed twice \(first at line 2"):
        load_conversations(root)
    with pytest.raises(ConversationalFormatError, match="missing file"):
        load_conversations(root, "train")


QRECC = [
    {"Conversation_no": 1, "Turn_no": 1, "Question": "What is a PA?", "Rewrite": "What is a PA?"},
    {"Conversation_no": 1, "Turn_no": 2, "Question": "Cost?", "Rewrite": "What does a PA cost?"},
    {"Conversation_no": 1, "Turn_no": 3, "Question": "And salary?", "Rewrite": "PA salary?"},
    {"Conversation_no": 2, "Turn_no": 1, "Question": "Goats?", "Rewrite": "Goat breeds?"},
]
ANSWERS = ["A medical provider.", "", "About 90,000 dollars.", "Boer, Angora."]


def test_qrecc_becomes_a_set_split_by_conversation(tmp_path: Path) -> None:
    records = [
        {**r, "Answer": a, "Conversation_source": "quac"}
        for r, a in zip(QRECC, ANSWERS, strict=True)
    ]
    counts = from_qrecc(records, tmp_path / "qrecc")
    assert sorted(counts.values()) == [1, 2]  # the unanswered turn is not judged
    train = load_conversations(tmp_path / "qrecc", "train")
    test = load_conversations(tmp_path / "qrecc", "test")
    assert not {t.conversation for t in train.turns} & {t.conversation for t in test.turns}
    both = {t.qid: t for t in (*train.turns, *test.turns)}
    salary = both["quac-1#3"]
    assert salary.message == "And salary?" and salary.rewrite == "PA salary?"
    # the chat as the user wrote it, the unanswered question kept, its empty answer not
    assert [m["content"] for m in salary.history] == ["What is a PA?", ANSWERS[0], "Cost?"]
    assert train.corpus[salary.relevant[0]] == ("", ANSWERS[2]) and len(train.corpus) == 3


def test_qrecc_conversion_refuses_a_folder_with_files_and_names_missing_fields(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        from_qrecc([{**QRECC[0], "Answer": "x"}], tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
    with pytest.raises(ConversationalFormatError, match="record 0: missing field 'Answer'"):
        from_qrecc([QRECC[0]], tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_intervals_resample_conversations_not_turns() -> None:
    # one conversation gains on all of its ten turns, the other loses on all of its:
    # turns look like twenty draws around 0, conversations are two
    a = {f"{c}#{i}": (1.0 if c == "up" else 0.0) for c in ("up", "down") for i in range(10)}
    b = {f"{c}#{i}": (0.0 if c == "up" else 1.0) for c in ("up", "down") for i in range(10)}
    conversations = {k: k.split("#")[0] for k in a}
    low, high, p = conversation_interval(a, b, conversations)
    turn_low, turn_high = paired_interval(a, b)
    assert (low, high) == (-1.0, 1.0) and p == 1.0
    assert -0.6 < turn_low < turn_high < 0.6  # what resampling turns would claim
    same = conversation_interval(a, a, conversations)
    assert same[:2] == (0.0, 0.0) and same[2] == 1.0
    assert all(math.isnan(x) for x in conversation_interval(a, b, dict.fromkeys(a, "one")))


def test_a_consistent_gain_over_conversations_is_significant() -> None:
    conversations = {f"c{c}#{i}": f"c{c}" for c in range(12) for i in range(3)}
    a = dict.fromkeys(conversations, 0.8)
    b = {k: 0.5 + 0.01 * int(k[1:].split("#")[0]) for k in conversations}
    low, high, p = conversation_interval(a, b, conversations)
    assert 0 < low < high < 0.31 and p < 0.01


def test_the_stand_in_draws_the_rewrite_or_another_turn_of_the_same_chat(tmp_path: Path) -> None:
    cset = load_conversations(write_set(tmp_path / "set", TURNS))
    right = draw_rewrites(cset.turns, 1.0, seed=0)
    assert set(right) == {"pa#2", "goat#2", "goat#3"}
    assert all(ok for _, ok in right.values())
    wrong = draw_rewrites(cset.turns, 0.0, seed=0)
    # goat#2's other goat turns: goat#1 and goat#3 (relevant "goat", not "goat-fibre")
    assert wrong["goat#2"] == ("Tell me about Boer goats", False) or wrong["goat#2"][0] == (
        "What does a Boer goat cost?"
    )
    assert wrong["pa#2"][0] == "What is a physician assistant?"  # its own chat's other turn


def test_the_stand_in_answers_each_turn_by_its_chat_not_its_words(tmp_path: Path) -> None:
    # pa#2 and goat#3 are both "What does it cost?": only the chat tells them apart
    cset = load_conversations(write_set(tmp_path / "set", TURNS))
    llm = oracle_for(cset, StandIn(1.0, (0,)), seed=0)
    prompt = "User: Are angora ones good?\nAssistant: No.\nQuestion: What does it cost?"
    assert llm.complete(prompt).text == "What does a Boer goat cost?"
    with pytest.raises(ValueError, match="no answer"):
        ConversationOracleLLM(answers=[]).complete("anything")


@pytest.mark.parametrize("history_characters", [2000, 300])
def test_the_stand_in_writes_the_rewrite_of_the_turn_asked_not_of_an_earlier_one(
    tmp_path: Path, history_characters: int
) -> None:
    # turn 2's message and the (long) answer before it are in turn 3's chat: the
    # stand-in must still answer turn 3, the message Condense asks about, even when the
    # history bound cuts the last answer short; turn 4 has turn 2's very words
    first = ("Tell me about Boer goats", CORPUS["goat"] + " More on Boer goats." * 40)
    second = ("What does it cost?", "About 300 dollars.")
    third = ("Why?", "Demand for meat.")
    turns = [
        turn("goat", 1, first[0], first[0], ["goat"]),
        turn("goat", 2, second[0], "What does a Boer goat cost?", ["nurse"], chat(first)),
        turn(
            "goat", 3, "Why?", "Why does a Boer goat cost 300 dollars?", ["pa"], chat(first, second)
        ),
        turn(
            "goat",
            4,
            second[0],
            "What does an Angora goat cost?",
            ["goat-fibre"],
            chat(first, second, third),
        ),
    ]
    cset = load_conversations(write_set(tmp_path / "set", turns))
    condense = Condense(
        oracle_for(cset, StandIn(1.0, (0,)), seed=0),
        standalone_words=None,
        history_characters=history_characters,
    )
    for t in cset.turns[1:]:
        result = condense.transform(t.message, chat_history=list(t.history))
        assert not result.fallback and result.queries[-1] == t.rewrite


def scored(tmp_path: Path, llm: Any, **kwargs: Any) -> Any:
    cset = load_conversations(write_set(tmp_path / "set", TURNS))
    spec = TransformSpec("condense", "condense", {"standalone_words": None})
    options = {"embed_model": DeterministicEmbedding(dim=256), "embed_label": "det"}
    return cset, run_conversations(
        cset, [spec], llm=llm, cache_root=tmp_path / "cache", top_k=5, **options, **kwargs
    )


def test_condense_is_scored_with_each_turns_own_chat(tmp_path: Path) -> None:
    prompts: list[str] = []

    def condense(prompt: str) -> str:
        prompts.append(prompt)
        return "Boer goat cost" if "Boer" in prompt else "physician assistant tuition cost"

    _, result = scored(tmp_path, ScriptedLLM(respond=condense))
    labels = [r.label for r in result.reports]
    assert labels == [AS_WRITTEN, HUMAN_REWRITE, "condense"]
    plain, _, condensed = result.reports
    assert plain.queries == 3 and condensed.usage.calls == 3 and condensed.fallbacks == 0
    assert sum("physician" in p for p in prompts) == 1 and sum("Boer" in p for p in prompts) == 2
    assert condensed.delta_vs_none is not None and condensed.delta_vs_none > 0
    assert condensed.interval_vs_none is not None and condensed.p_value_vs_none is not None
    assert result.config["set"] == "conversational" and "over conversations" in str(
        result.config["intervals"]
    )
    assert 0 < share_kept(result, "condense") <= 2


def test_a_condense_that_ignores_the_chat_changes_nothing(tmp_path: Path) -> None:
    def repeat(prompt: str) -> str:  # what a condense blind to the chat can do
        return prompt.split("Follow-up message: ", 1)[1].split("\n", 1)[0]

    _, result = scored(tmp_path, ScriptedLLM(respond=repeat))
    condensed = result.reports[2]
    assert condensed.usage.calls == 3 and condensed.identical_to_none
    assert condensed.delta_vs_none == 0 and condensed.p_value_vs_none == 1.0


def test_the_stand_in_run_is_averaged_over_seeds_and_never_cached(tmp_path: Path) -> None:
    _, result = scored(tmp_path, None, standin=StandIn(1.0, (0, 1)))
    condensed = result.reports[2]
    assert condensed.label == "condense (oracle:1)" and condensed.fallbacks == 0
    assert condensed.usage.calls == 6 and condensed.cached == 0  # 3 turns, 2 seeds
    plain = result.reports[0].scores["nDCG@10"]
    assert plain < condensed.scores["nDCG@10"] <= result.reports[1].scores["nDCG@10"]
    assert condensed.changed > 0
    assert "stand-in" in result.config["stand_in"]


def test_a_set_with_no_follow_ups_is_refused(tmp_path: Path) -> None:
    cset = load_conversations(write_set(tmp_path / "set", [TURNS[0], TURNS[2]]))
    with pytest.raises(ValueError, match="no follow-up turns"):
        run_conversations(
            cset,
            [],
            llm=None,
            embed_model=DeterministicEmbedding(dim=64),
            embed_label="det",
            cache_root=tmp_path,
        )


def test_tune_refuses_a_conversational_set_before_any_work(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    root = write_set(tmp_path / "set", TURNS)
    args = ["tune", "--dataset", str(root), "--transform", "hyde", "--llm", "oracle:1.0"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code != 0 and "conversational set" in result.output
    assert "hyde-plus eval --dataset" in result.output and not (tmp_path / "out").exists()


@pytest.mark.local
def test_eval_detects_a_conversational_set_end_to_end(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llama_index_hyde_plus.cli import app

    root = write_set(tmp_path / "set", TURNS)
    args = ["eval", "--dataset", str(root), "--llm", "oracle:1.0:2", "--embed", "local"]
    args += ["--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    labels = [r["transform"] for r in data["results"]]
    assert labels == [AS_WRITTEN, HUMAN_REWRITE, "condense (oracle:1)"]
    assert data["config"]["set"] == "conversational" and data["queries"] == 3
    assert "Recommendation: use `human rewrite`" not in result.output


def test_the_drift_guard_grid_reuses_one_generation_per_turn() -> None:
    from llama_index_hyde_plus.transforms.condense import Condense

    lines = ("User: What is a physician assistant?", "Assistant: A licensed provider.")
    keys = {
        Condense(ScriptedLLM(), original_weight=w, standalone_words=s).cache_key_for(
            "What does it cost?", lines
        )
        for w in (0.5, 1.0, 4.0)
        for s in (None, 8)
    }
    assert len(keys) == 1
    other = Condense(ScriptedLLM()).cache_key_for("What does it cost?", lines[:1])
    assert other not in keys  # another chat is another generation
