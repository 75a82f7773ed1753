"""What cannot be chained and which strategies exist are each decided in one place:
every entry point refuses the same options with the same message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llama_index_hyde_plus import HyDE, MultiQuery, StepBack
from llama_index_hyde_plus.testing import ScriptedLLM
from llama_index_hyde_plus.transforms.base import ChainTransform, Guards, QueryTransformer
from llama_index_hyde_plus.transforms.config import load_config
from llama_index_hyde_plus.transforms.feedback import Rocchio
from llama_index_hyde_plus.transforms.registry import check_options, make_transform

REFUSAL = (
    "then() cannot compose {name} with a rerank strategy, grounding, feedback or a gate "
    "(they act on one question's own search); use it on its own, or without those options"
)
STRATEGY = "strategy must be 'replace' or 'rerank', not 'boost'"


class _Guarded(QueryTransformer):
    """A user's transform whose guards are set by hand."""

    def __init__(self, guards: Guards) -> None:
        super().__init__()
        self.guards = guards

    def transform(self, query: str) -> Any:
        return [query]


def _hyde(**options: Any) -> HyDE:
    return HyDE(ScriptedLLM(["A passage."]), **options)


def _plain() -> MultiQuery:
    return MultiQuery(ScriptedLLM(["a"]))


GUARDED = [
    ("HyDE", lambda: _hyde(strategy="rerank")),
    ("HyDE", lambda: _hyde(gate=0.2)),
    ("HyDE", lambda: _hyde(gate_relative=0.1)),
    ("HyDE", lambda: _hyde(grounded=2)),
    ("Rocchio", lambda: Rocchio(k=3, beta=0.5)),
    ("_Guarded", lambda: _Guarded(Guards(strategy="rerank"))),
    ("_Guarded", lambda: _Guarded(Guards(gate=0.5))),
    ("_Guarded", lambda: _Guarded(Guards(context_k=1))),
]
JOINS = {
    "second of then()": lambda guarded: _plain().then(guarded),
    "first of then()": lambda guarded: guarded.then(_plain()),
    "ChainTransform(first, second)": lambda guarded: ChainTransform(StepBack(None), guarded),
}


@pytest.mark.parametrize("join", list(JOINS))
@pytest.mark.parametrize(("name", "build"), GUARDED)
def test_every_way_of_chaining_a_guarded_transform_is_refused_with_one_message(
    join: str, name: str, build: Any
) -> None:
    with pytest.raises(ValueError) as caught:
        JOINS[join](build())
    assert str(caught.value) == REFUSAL.format(name=name)


def test_hyde_with_only_its_shipped_guards_still_chains() -> None:
    """The small generator's shipped gate is a default, not asked for: dropped in a chain."""
    chain = _plain().then(_hyde())
    assert chain.second.guards == Guards()


def _config_file(tmp_path: Path, options: dict[str, Any]) -> Path:
    path = tmp_path / "hyde.json"
    path.write_text(
        json.dumps({"hyde_plus_config": 1, "transform": "hyde", "options": options}),
        encoding="utf-8",
    )
    return path


def test_every_entry_point_refuses_an_unknown_strategy_with_one_message(tmp_path: Path) -> None:
    entry_points = {
        "Guards": lambda: Guards(strategy="boost"),  # type: ignore[arg-type]
        "HyDE": lambda: _hyde(strategy="boost"),
        "make_transform": lambda: make_transform("hyde", strategy="boost"),
        "check_options": lambda: check_options("hyde", {"strategy": "boost"}),
    }
    for where, call in entry_points.items():
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == STRATEGY, where
    path = _config_file(tmp_path, {"strategy": "boost"})
    with pytest.raises(ValueError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: {STRATEGY}"


@pytest.mark.parametrize("value", ["", 0, None, ["rerank"]])
def test_guards_refuse_a_strategy_that_is_not_one_of_the_two_names(value: Any) -> None:
    with pytest.raises(ValueError, match="strategy must be 'replace' or 'rerank'"):
        Guards(strategy=value)
