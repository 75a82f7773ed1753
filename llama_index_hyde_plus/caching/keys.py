"""The transform cache key: a documented list of plain data.

The key (`transform_key`) is the SHA-256 of the sorted JSON of:

- ``sent``: what the model receives: the prompt as rendered for this question, and
  what the LLM's own formatters (not LlamaIndex's defaults) make of it (`sent_to`);
- ``llm`` and ``model``: the LLM's class (module and qualified name) and model name;
- ``llm_settings``: those of `LLM_SETTINGS` the LLM has, read by attribute;
- ``method`` and ``params``: the transform and its generation options (its
  constructor options but `NOT_GENERATION_OPTIONS` and its ``SEARCH_OPTIONS``);
- ``query``, and for a grounded transform the passages shown to the model (``context``).

Nothing else is read: not the LLM object's other state (a call counter, usage
statistics, a client), not the code or globals of a function. A formatter is keyed by
its output; a prompt function whose output depends on state it does not show (a clock,
a file, a global) is the caller's to key, as LangChain's and LlamaIndex's caches
expect. Plain data only: the same key in every process for the same configuration.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from typing import Any

from llama_index.core.base.llms.generic_utils import messages_to_prompt
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.llm import default_completion_to_prompt
from pydantic import BaseModel

from ..calls import llm as _llm
from .cache import cache_key

__all__ = ["LLM_SETTINGS", "NOT_GENERATION_OPTIONS", "Unkeyable", "option_value", "transform_key"]


class Unkeyable(TypeError):
    """A part of the key with no plain form: the transform is not cached."""


LLM_SETTINGS = (
    *("temperature", "max_tokens", "max_new_tokens", "num_predict", "top_p", "top_k"),
    *("min_p", "typical_p", "seed", "stop", "frequency_penalty", "presence_penalty"),
    *("repetition_penalty", "repeat_penalty", "stop_token", "eos_token", "reasoning_effort"),
    *("system_prompt",),
    *("additional_kwargs", "generate_kwargs", "model_kwargs", "logprobs", "top_logprobs"),
    *("model_path", "api_base", "base_url", "azure_endpoint", "deployment_name", "engine"),
)
"""The LLM attributes in the key: LlamaIndex's generation settings, the extra
arguments sent with each call, and where the model runs (another endpoint or file
may serve other weights under one name). Not in it: secrets, timeouts, retries,
headers, clients, callbacks, the context window and the machine the model runs on."""

NOT_GENERATION_OPTIONS: frozenset[str] = frozenset(
    {"prompt", "cache", "callback_manager", "retry", "breaker", "timeout", "prices", "profile"}
)
"""Transform options that do not change what the LLM writes (the prompt is in the key
as what it renders; ``profile`` chooses search defaults only)."""


def transform_key(
    method: str, llm: Any, prompt: str, params: dict[str, Any], query: str, context: Any
) -> str:
    """The cache key of one generation of ``method`` by ``llm`` for ``prompt`` (as
    rendered for ``query``), with generation options ``params`` (plain data, see
    `option_value`) and a grounded transform's ``context`` (see the module's docstring)."""
    own = getattr(llm, "__dict__", None) or {}
    names = {*_class_settings(llm.__class__), *(n for n in LLM_SETTINGS if n in own)}
    settings = {name: getattr(llm, name) for name in names}
    kind = type(llm)
    parts = {
        "method": method,
        "llm": f"{kind.__module__}.{kind.__qualname__}",
        "model": _llm.model_name(llm),
        "llm_settings": _json_data(settings, "llm setting"),
        "sent": sent_to(llm, prompt),
        "params": params,
        "query": query,
    }
    if context:
        parts["context"] = list(context)
    return cache_key(parts)


@functools.cache
def _class_settings(cls: Any) -> tuple[str, ...]:
    """The `LLM_SETTINGS` ``cls`` gives every instance, once per class (a pydantic
    model is slow to refuse a missing attribute)."""
    fields = getattr(cls, "model_fields", {})
    return tuple(n for n in LLM_SETTINGS if n in fields or hasattr(cls, n))


def sent_to(llm: object, prompt: str) -> dict[str, Any]:
    """What the model receives for ``prompt``: the prompt, and the output of each of the
    LLM's own formatters that is not LlamaIndex's default (``completion_to_prompt`` of
    the prompt, ``messages_to_prompt`` of it as one user message). A formatter that
    raises on that input is `Unkeyable`."""
    sent: dict[str, Any] = {"prompt": prompt}
    formatters = (
        ("completion_to_prompt", default_completion_to_prompt, lambda: prompt),
        ("messages_to_prompt", messages_to_prompt, lambda: [ChatMessage.from_str(prompt)]),
    )
    for name, default, given in formatters:
        fn = getattr(llm, name, None)
        if fn is None or fn is default or not callable(fn):
            continue
        try:
            sent[name] = _json_data(fn(given()), name)
        except Exception as exc:
            raise Unkeyable(f"{name} cannot be keyed by its output ({exc!r})") from exc
    return sent


def option_value(name: str, value: Any) -> Any:
    """Option ``name``'s ``value`` as plain data for the key; `Unkeyable` without one."""
    return _json_data(value, f"option {name}")


def _json_data(value: Any, what: str) -> Any:
    """``value`` as JSON data (enums by value, numpy numbers and arrays as lists, sets
    sorted, pydantic models by their JSON dump); `Unkeyable` for anything else."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return _json_data(value.tolist(), what)
    if isinstance(value, (list, tuple)):
        return [_json_data(v, what) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_json_data(v, what) for v in value), key=repr)
    if isinstance(value, Mapping):
        return {str(_json_data(k, what)): _json_data(v, what) for k, v in value.items()}
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise Unkeyable(f"{what} {value!r:.60} has no plain form for a cache key")
