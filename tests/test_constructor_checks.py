"""Every public constructor refuses a bad parameter up front, with a `TypeError` or
`ValueError` naming it, instead of accepting it and failing later (a NaN cooldown, a
string ``retry``, a ``callback_manager`` that is not one, a ``prompt`` that is not a
prompt)."""

from __future__ import annotations

import inspect
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.callbacks import CallbackManager
from llama_index.core.prompts import PromptTemplate
from llama_index.core.storage.kvstore import SimpleKVStore

import llama_index_hyde_plus as pkg
from llama_index_hyde_plus import (
    FusionMode,
    HyDE,
    HyDERAG,
    ModelPrice,
    SQLiteCache,
    TransformRetriever,
)
from llama_index_hyde_plus.caching.kv_cache import KVStoreCache
from llama_index_hyde_plus.calls.reliability import CircuitBreaker, RetryPolicy
from llama_index_hyde_plus.testing import ScriptedLLM, StaticRetriever

LLM = ScriptedLLM(respond=lambda prompt: "Renewals slipped last quarter.")


def _retriever() -> StaticRetriever:
    return StaticRetriever({"a": "alpha", "b": "beta"})


def _make(name: str, tmp_path: Path) -> Callable[..., Any]:
    """A constructor of the class ``name`` that fills its required objects with good
    ones, so that only the keyword under test is bad."""
    makers: dict[str, Callable[..., Any]] = {
        "CircuitBreaker": CircuitBreaker,
        "RetryPolicy": RetryPolicy,
        "ModelPrice": lambda **k: ModelPrice(**{"input_per_mtok": 1, "output_per_mtok": 1, **k}),
        "SQLiteCache": lambda **k: SQLiteCache(k.pop("path", tmp_path / "c.sqlite"), **k),
        "KVStoreCache": lambda **k: KVStoreCache(SimpleKVStore(), **k),
        "TransformRetriever": lambda **k: TransformRetriever(_retriever(), HyDE(LLM), **k),
        "HyDERAG": lambda **k: HyDERAG(_retriever(), **{"hyde_llm": LLM, "answer_llm": LLM, **k}),
    }
    if name in makers:
        return makers[name]
    cls = getattr(pkg, name)
    if "llm" in inspect.signature(cls).parameters:
        return lambda **k: cls(LLM, **k)
    return cls  # type: ignore[no-any-return]


CASES = [
    # the breaker: a NaN cooldown never half-opens again, a NaN threshold never opens
    ("CircuitBreaker", "cooldown_s", math.nan),
    ("CircuitBreaker", "cooldown_s", math.inf),
    ("CircuitBreaker", "cooldown_s", True),
    ("CircuitBreaker", "cooldown_s", 1e30),
    ("CircuitBreaker", "cooldown_s", "3"),
    ("CircuitBreaker", "failure_threshold", math.nan),
    ("CircuitBreaker", "failure_threshold", math.inf),
    ("CircuitBreaker", "failure_threshold", 2.5),
    ("CircuitBreaker", "failure_threshold", True),
    ("CircuitBreaker", "failure_threshold", 10**30),
    ("CircuitBreaker", "failure_threshold", None),
    ("CircuitBreaker", "name", 3),
    ("CircuitBreaker", "name", ""),
    # retries: a NaN delay turned every transient error into a fallback
    ("RetryPolicy", "max_delay_s", math.nan),
    ("RetryPolicy", "max_delay_s", math.inf),
    ("RetryPolicy", "max_delay_s", True),
    ("RetryPolicy", "max_delay_s", -1),
    ("RetryPolicy", "base_delay_s", math.nan),
    ("RetryPolicy", "base_delay_s", "3"),
    ("RetryPolicy", "max_retries", math.nan),
    ("RetryPolicy", "max_retries", True),
    ("RetryPolicy", "max_retries", 2.5),
    ("RetryPolicy", "max_retries", 10**30),
    ("RetryPolicy", "max_retries", None),
    # the LLM transforms' shared options (LLMOptions)
    ("HyDE", "retry", "3"),
    ("HyDE", "retry", object()),
    ("HyDE", "retry", 3),
    ("HyDE", "callback_manager", object()),
    ("HyDE", "prices", {"scripted": 5}),
    ("HyDE", "prices", 3),
    ("HyDE", "prices", []),
    ("HyDE", "prices", {3: ModelPrice(1, 1)}),
    ("HyDE", "prompt", 3),
    ("HyDE", "prompt", 0),
    ("HyDE", "prompt", ""),
    ("HyDE", "prompt", []),
    ("MultiQuery", "retry", object()),
    ("StepBack", "callback_manager", "handlers"),
    ("Decompose", "prices", {"m": (0.1, 0.2)}),
    ("Rewrite", "prompt", object()),
    ("Condense", "memory", [{"role": "user", "content": "hi"}]),
    ("Condense", "history_messages", 0),
    ("Condense", "history_characters", True),
    ("Condense", "standalone_words", 2.5),
    # a price: a NaN one made every cost NaN
    ("ModelPrice", "input_per_mtok", math.nan),
    ("ModelPrice", "input_per_mtok", True),
    ("ModelPrice", "output_per_mtok", math.inf),
    ("ModelPrice", "output_per_mtok", "1"),
    # the retriever
    ("TransformRetriever", "callback_manager", object()),
    ("TransformRetriever", "verbose", "yes"),
    ("TransformRetriever", "verbose", None),
    ("TransformRetriever", "fusion", "3"),
    ("TransformRetriever", "fusion", []),
    ("TransformRetriever", "object_map", []),
    ("TransformRetriever", "top_k", 2**31),
    ("HyDERAG", "top_k", 2**31),
    # the SQLite cache: an infinite busy timeout hangs a search on a locked file
    ("SQLiteCache", "ttl_s", True),
    ("SQLiteCache", "ttl_s", math.inf),
    ("SQLiteCache", "ttl_s", "3"),
    ("SQLiteCache", "busy_timeout_s", math.inf),
    ("SQLiteCache", "busy_timeout_s", True),
    ("SQLiteCache", "busy_timeout_s", None),
    ("SQLiteCache", "path", 3),
    # HyDERAG: its own options, named as it names them
    ("HyDERAG", "answer_temperature", math.nan),
    ("HyDERAG", "answer_temperature", "0"),
    ("HyDERAG", "hyde_temperature", 5),
    ("HyDERAG", "answer_prompt", 3),
    ("HyDERAG", "answer_prompt", 0),
    ("HyDERAG", "answer_llm", object()),
    ("HyDERAG", "prices", 3),
    ("HyDERAG", "prices", {"m": 5}),
]


@pytest.mark.parametrize(
    ("name", "param", "value"), CASES, ids=lambda v: re.sub(r" at 0x[0-9a-f]+", "", repr(v))[:24]
)
def test_a_bad_parameter_is_refused_up_front_naming_it(
    name: str, param: str, value: Any, tmp_path: Path
) -> None:
    with pytest.raises((TypeError, ValueError), match=re.escape(param)):
        _make(name, tmp_path)(**{param: value})


#: Public constructors (every class of ``__all__`` that is built from options, and the
#: reliability and KV-cache classes), each with the keywords the sweep tries.
_SWEPT = [
    "CircuitBreaker",
    "RetryPolicy",
    "ModelPrice",
    "SQLiteCache",
    "KVStoreCache",
    "TransformRetriever",
    "HyDERAG",
    "HyDE",
    "MultiQuery",
    "StepBack",
    "Decompose",
    "Rewrite",
    "Condense",
    "Rocchio",
    "MemoryCache",
]
_LLM_OPTIONS = ["prompt", "temperature", "timeout", "prices", "callback_manager"]
_LLM_OPTIONS += ["cache", "retry", "breaker", "profile"]
_OBJECTS = {"llm", "retriever", "index_or_retriever", "kvstore", "hyde_llm", "transformer"}


def _keywords(name: str) -> list[tuple[str, bool]]:
    """``(keyword, is a bool option)`` for each option of ``name`` the sweep tries."""
    cls = {"CircuitBreaker": CircuitBreaker, "RetryPolicy": RetryPolicy}.get(name)
    cls = cls or {"KVStoreCache": KVStoreCache}.get(name) or getattr(pkg, name)
    params = inspect.signature(cls).parameters
    found = [
        (p, "bool" in str(spec.annotation).split(" | ")[0])
        for p, spec in params.items()
        if spec.kind not in (spec.VAR_KEYWORD, spec.VAR_POSITIONAL)
        and p not in _OBJECTS
        and p != "query_transform"
    ]
    if "llm" in params:
        found += [(p, False) for p in _LLM_OPTIONS]
    return found


_SWEEP = [(name, p, is_bool) for name in _SWEPT for p, is_bool in _keywords(name)]


@pytest.mark.parametrize(("name", "param", "is_bool"), _SWEEP, ids=lambda v: str(v))
def test_no_constructor_keyword_accepts_nan_infinity_or_a_stray_object(
    name: str, param: str, is_bool: bool, tmp_path: Path
) -> None:
    """NaN, infinity, an empty list and a bare object are valid for no keyword of any
    public constructor, nor ``True`` for one that is not a bool: each is refused with an
    error naming the keyword (the round-8 fuzz, kept)."""
    make = _make(name, tmp_path)
    bad: list[Any] = [math.nan, math.inf, -math.inf, [], object()]
    if not is_bool:
        bad.append(True)
    for value in bad:
        with pytest.raises((TypeError, ValueError), match=re.escape(param)):
            make(**{param: value})


def test_the_sweep_covers_every_public_constructor_of_options() -> None:
    """Every class of ``__all__`` that takes options is swept (results and records,
    built by the package, are not)."""
    records = {"HyDERAGResult", "SearchResult", "TransformResult", "Usage"}
    abstract = {"QueryTransformer", "FusionMode"}
    classes = {n for n in pkg.__all__ if inspect.isclass(getattr(pkg, n))}
    assert classes - records - abstract <= set(_SWEPT)


def test_good_values_at_the_edges_are_still_taken(tmp_path: Path) -> None:
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=0.5, name="p")
    assert (breaker.failure_threshold, breaker.cooldown_s) == (1, 0.5)
    policy = RetryPolicy(max_retries=0, base_delay_s=0, max_delay_s=2)
    assert (policy.base_delay_s, policy.max_delay_s) == (0.0, 2.0)
    assert isinstance(policy.max_delay_s, float)
    price = ModelPrice(0, 1)
    assert price.cost(1_000_000, 1_000_000) == 1.0
    hyde = HyDE(
        LLM,
        prices={"scripted": price},
        prompt=PromptTemplate("Passage for {query}:"),
        retry=RetryPolicy(0),
        callback_manager=CallbackManager([]),
        temperature=0,
    )
    assert hyde.prices == {"scripted": price}
    assert HyDE(LLM, prices={}).prices is None
    for fusion in ("rrf", FusionMode.MAX):
        assert TransformRetriever(_retriever(), HyDE(LLM), fusion=fusion).fusion == fusion
    assert SQLiteCache(tmp_path / "c.sqlite", ttl_s=1, busy_timeout_s=0).ttl_s == 1.0
    assert HyDERAG(_retriever(), hyde_llm=LLM, answer_llm=LLM, answer_temperature=0).top_k == 5


def test_from_index_refuses_a_depth_that_would_abort_faiss() -> None:
    """``similarity_top_k=2**31`` reached FAISS, whose ``std::bad_alloc`` ended the
    process (no exception); 10,000 is taken."""
    from llama_index.core import Document, VectorStoreIndex

    from llama_index_hyde_plus.testing import DeterministicEmbedding

    embed = DeterministicEmbedding()
    index = VectorStoreIndex.from_documents([Document(text="renewals")], embed_model=embed)
    with pytest.raises(ValueError, match="similarity_top_k"):
        TransformRetriever.from_index(index, HyDE(LLM), similarity_top_k=2**31)
    deep = TransformRetriever.from_index(index, HyDE(LLM), similarity_top_k=10_000)
    assert deep.top_k == 10_000


def test_a_nan_cooldown_no_longer_leaves_rewriting_off_for_good() -> None:
    """The round-8 run: ``CircuitBreaker(cooldown_s=nan)`` opened on one failure and
    100 of 100 later calls fell back. Refused now; a real cooldown half-opens."""
    with pytest.raises(ValueError, match="cooldown_s"):
        CircuitBreaker(failure_threshold=1, cooldown_s=math.nan)
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=0.05)
    llm = ScriptedLLM([ConnectionError("down")], respond=lambda p: "Renewals slipped.")
    hyde = HyDE(llm, breaker=breaker, retry=RetryPolicy(0))
    assert hyde.transform("q0").fallback
    time.sleep(0.06)  # the cooldown passes
    assert sum(hyde.transform(f"q{i}").fallback for i in range(1, 11)) == 0
    assert breaker.state == "closed"


@pytest.mark.parametrize("bad", [0, False, [], "filters", {1: 2}])
def test_from_index_refuses_retriever_kwargs_that_are_not_options(bad: Any) -> None:
    from llama_index.core import Document, VectorStoreIndex

    from llama_index_hyde_plus import HyDE, TransformRetriever
    from llama_index_hyde_plus.testing import DeterministicEmbedding, ScriptedLLM

    index = VectorStoreIndex.from_documents(
        [Document(text="Renewals slipped.")], embed_model=DeterministicEmbedding()
    )
    with pytest.raises(TypeError, match="retriever_kwargs"):
        TransformRetriever.from_index(index, HyDE(ScriptedLLM(replies=["x"])), retriever_kwargs=bad)
