"""The transform cache key: what the model is sent, and what else shapes the reply.

A key is built from plain data only, so it is the same in every process for the same
configuration (replicas of ``serve`` on one Redis share hits) and differs whenever
what is generated or kept could differ (round 3: keys made of ``id()`` served 106 of
200 questions another configuration's answer).

- What is sent (`sent_to`): the rendered prompt (the template with its partials,
  variable and function mappings applied) and, for an LLM that formats prompts
  itself, what its ``completion_to_prompt`` / ``messages_to_prompt`` make of it. A
  formatter is thus keyed by its output, whatever it reads (a file, the clock, a big
  table): nothing of it is read but the call itself.
- What shapes the reply besides (`llm_settings`, `generation_options`): the LLM's own
  plain settings and the transform's generation options. A function among them (an
  LLM's reply hook, a parser applied to the reply) cannot be keyed by an output, so it
  is keyed by what it computes (`callable_identity`): its code and every global it
  reads, by value; of the process environment only the variables it names, when it
  names them as constants (`environment_reads`).
"""

from __future__ import annotations

import dis
import enum
import functools
import hashlib
import inspect
import os
import re
import types
from collections.abc import Mapping
from types import CodeType
from typing import Any

from pydantic import BaseModel

__all__ = [
    "NOT_GENERATION_OPTIONS",
    "Unkeyable",
    "callable_identity",
    "environment_reads",
    "generation_options",
    "llm_settings",
    "option_value",
    "same_snapshot",
    "sent_to",
    "settings_snapshot",
]


class Unkeyable(TypeError):
    """A setting whose effect has no stable plain form (a callable over objects the key
    cannot read): such a transform is not cached, rather than cached under a key that
    another setting could share."""


# -- what is sent ------------------------------------------------------------------------
FORMATTERS = ("completion_to_prompt", "messages_to_prompt")
"""The LLM fields that turn a prompt into the text the model receives: keyed by their
output (`sent_to`), so they are not settings (`llm_settings`)."""


def sent_to(llm: object, prompt: str) -> dict[str, Any]:
    """What the model receives for the rendered ``prompt``, for the key: the prompt,
    and the output of each of the LLM's formatters (`FORMATTERS`) that is not
    LlamaIndex's default (``completion_to_prompt(prompt)``, ``messages_to_prompt`` of
    the prompt as one user message). Whether an LLM class applies a formatter on
    ``complete`` is its own business, so both are called whenever set: an output that
    is not applied only costs a miss when it changes. A formatter that raises (it may
    expect other input) is keyed by what it computes instead (`callable_identity`).

    Args:
        llm: The LLM the prompt goes to.
        prompt: The prompt as the transform renders it."""
    sent: dict[str, Any] = {"prompt": prompt}
    for name in FORMATTERS:
        fn = getattr(llm, name, None)
        if fn is None or fn is _defaults()[name] or not callable(fn):
            continue
        try:
            sent[name] = _exact(fn(_formatter_input(name, prompt)), 0)
        except Unkeyable:
            raise
        except Exception:  # it wants other input: keyed by what it computes
            sent[name] = ["identity", callable_identity(fn, 0)]
    return sent


def _formatter_input(name: str, prompt: str) -> Any:
    """What formatter ``name`` gets for ``prompt``: the prompt, or for
    ``messages_to_prompt`` the prompt as one user message."""
    if name == "completion_to_prompt":
        return prompt
    from llama_index.core.llms import ChatMessage, MessageRole

    return [ChatMessage(role=MessageRole.USER, content=prompt)]


@functools.cache
def _defaults() -> dict[str, Any]:
    """LlamaIndex's own formatters (an LLM gets them when it is given none): the
    prompt unchanged, and the generic ``role: content`` rendering; both are pure
    functions of the prompt, so they add nothing to a key."""
    from llama_index.core.base.llms.generic_utils import messages_to_prompt
    from llama_index.core.llms.llm import default_completion_to_prompt

    return {
        "completion_to_prompt": default_completion_to_prompt,
        "messages_to_prompt": messages_to_prompt,
    }


# -- the transform's own options ---------------------------------------------------------
NOT_GENERATION_OPTIONS: frozenset[str] = frozenset(
    {"prompt", "cache", "callback_manager", "retry", "breaker", "timeout", "prices", "profile"}
)
"""The `LLMOptions` that do not change what the LLM writes, so are not in `_params`
(the prompt is in the key as what it renders, `sent_to`; ``profile`` chooses search
defaults only)."""


@functools.cache
def generation_options(cls: Any) -> tuple[str, ...]:
    """The options of transform class ``cls`` in its cache key: its ``option_names()``
    but `NOT_GENERATION_OPTIONS` and its ``SEARCH_OPTIONS`` (see
    `LLMTransform._params`).

    Args:
        cls: An `LLMTransform` class."""
    skip = NOT_GENERATION_OPTIONS | cls.SEARCH_OPTIONS
    return tuple(name for name in cls.option_names() if name not in skip)


def option_value(name: str, value: Any) -> Any:
    """Option ``name``'s ``value`` as plain data for the key; `TypeError` when it has
    none (no key, no cache).

    Args:
        name: The option's name (for the error).
        value: Its value."""
    plain = _plain(value)
    if plain is _SKIP:
        raise TypeError(f"option {name}={value!r} has no stable cache-key form")
    return plain


_NOT_SETTINGS = frozenset(
    {
        # transport: how the request goes, not what the model writes (where it goes, the
        # endpoint, is in the key: two servers may serve other weights under one name)
        "api_type",
        "api_version",
        "async_client",
        "async_http_client",
        "client",
        "connect_timeout",
        "default_headers",
        "extra_headers",
        "headers",
        "http_client",
        "max_retries",
        "num_retries",
        "organization",
        "read_timeout",
        "request_timeout",
        "retries",
        "reuse_client",
        "timeout",
        # machinery of the call: events, pacing, parsing of structured output
        "callback_manager",
        "output_parser",
        "rate_limiter",
        # the context window and the machine the model runs on
        "context_window",
        "device",
        "device_map",
        "n_ctx",
        "n_parallel",
        "n_threads",
        "num_workers",
        "threads",
    }
)
"""LLM settings that are not in the cache key (see `llm_settings`)."""

_SECRET = re.compile(
    r"^(?:key|token|auth|authorization|credentials?|password|passwd|secret)$"
    r"|(?:^|_)(?:api_?key|password|passwd|secret|credentials?|authorization)(?:$|_)"
    r"|(?:^|_)(?:access|auth|bearer|api|hf|hub|id|refresh|session|private)_?token$"
    r"|(?:^|_)(?:access|private|secret|subscription)_?key(?:_id)?$"
    r"|^auth_",
    re.IGNORECASE,
)
"""Names of secrets, never in a key: ``api_key``, ``openai_api_key``, ``hf_token``,
``access_token``, ``client_secret``, ``password``, ``auth_*``, a bare ``token`` or
``key``. Only secrets: a generation setting named for tokens (``stop_token``,
``eos_token``, ``stop_token_ids``, ``max_tokens``) is in the key. A secret the rule
misses only costs a cache miss when it changes (the key is a hash); a setting it
wrongly dropped would serve another setting's generation."""

_SCALARS = frozenset({str, int, float, bool, type(None)})
"""Exact types that are plain data as they are, checked first (their subclasses take
the longer way: an ``IntEnum`` enters a key by its value)."""

_SKIP = object()
_MAX_DEPTH = 16


def llm_settings(llm: object) -> dict[str, Any]:
    """The LLM's own settings that shape its replies, for the cache key: its pydantic
    fields holding plain data (numbers, strings, lists and dicts of them; functions by
    qualified name), such as ``temperature``, ``max_tokens``, ``additional_kwargs``,
    ``seed`` or ``system_prompt``. Left out: secrets (keys, tokens, passwords),
    transport (URLs, timeouts, retries, headers, clients), callbacks, the context
    window, any object without a plain form (its repr may hold an address), and the
    names an LLM class lists in a ``cache_key_ignores`` class attribute. The prompt
    formatters (`FORMATTERS`) are keyed by their output instead (`sent_to`).

    Args:
        llm: The transform's LLM."""
    return _model_settings(llm, 0, FORMATTERS) if isinstance(llm, BaseModel) else {}


def settings_snapshot(llm: object) -> tuple[Any, ...] | None:
    """What `llm_settings` reads of ``llm``, when all of it is immutable: the class and
    every setting field's value (scalars, enum members over a scalar, and functions
    that hold and read nothing but their code, with that code and their names), to
    compare by identity; None when any value could change in place (a dict, a list, a
    model, a closure, a function reading a global) or cannot be read. Equal snapshots
    (each part the very same object) mean equal settings: a transform reads them once
    while that holds (`LLMTransform.cache_key_for`).

    Args:
        llm: The transform's LLM."""
    if not isinstance(llm, BaseModel):
        return None
    kind = type(llm)
    parts: list[Any] = [kind]
    for name in _setting_fields(kind):
        if name in FORMATTERS:
            continue  # not a setting (keyed by output, `sent_to`)
        try:
            value = getattr(llm, name)
        except Exception:
            return None
        if type(value) in _SCALARS or (
            isinstance(value, enum.Enum) and type(value.value) in _SCALARS
        ):
            parts.append(value)
        elif inspect.isfunction(value) and _reads_only_its_code(value):
            parts.extend((value, value.__code__, value.__module__, value.__qualname__))
        else:
            return None
    return tuple(parts)


def same_snapshot(one: tuple[Any, ...], other: tuple[Any, ...]) -> bool:
    """Whether two `settings_snapshot`s hold the very same objects."""
    return len(one) == len(other) and all(a is b for a, b in zip(one, other))


def _reads_only_its_code(fn: Any) -> bool:
    if fn.__closure__ or fn.__defaults__ or fn.__kwdefaults__:
        return False
    return _code_read(fn.__code__, 1)[1].isdisjoint(fn.__globals__)


def _model_settings(model: BaseModel, depth: int, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``model``'s settings (`_setting_fields`) but ``skip``: the LLM's own formatters
    (keyed by output); an LLM held in a field (a router's) keeps its own in full."""
    out: dict[str, Any] = {}
    for name in _setting_fields(type(model)):
        if name in skip:
            continue
        try:
            value = _plain(getattr(model, name), depth + 1)
        except Unkeyable:
            raise
        except Exception:  # a field that cannot be read is no setting of ours
            continue
        if value is not _SKIP:
            out[name] = value
    return out


@functools.cache
def _setting_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``cls`` that may be settings (by name; see `llm_settings`)."""
    ignored = frozenset(getattr(cls, "cache_key_ignores", ()))
    return tuple(n for n in cls.model_fields if n not in ignored and _is_setting(n))


def _is_setting(name: object) -> bool:
    return isinstance(name, str) and name not in _NOT_SETTINGS and not _SECRET.search(name)


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON data, the same in every process, or `_SKIP`. Dict
    entries named like secrets or transport (`_is_setting`) are dropped at any depth."""
    if type(value) in _SCALARS:
        return value
    if depth > _MAX_DEPTH:
        return _SKIP
    if isinstance(value, enum.Enum):
        value = value.value
    elif isinstance(value, os.PathLike):
        value = os.fspath(value)
    elif type(value).__module__ == "numpy" and callable(getattr(value, "tolist", None)):
        value = value.tolist()  # a numpy number or array, as Python numbers
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v, depth + 1) for v in value]
        return [v for v in items if v is not _SKIP]
    if isinstance(value, (set, frozenset)):
        items = [_plain(v, depth + 1) for v in value]
        return sorted((v for v in items if v is not _SKIP), key=repr)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if isinstance(k, enum.Enum):
                k = k.value
            if not isinstance(k, (str, int, float, bool)) or not _is_setting(str(k)):
                continue
            plain = _plain(v, depth + 1)
            if plain is not _SKIP:
                out[str(k)] = plain
        return out
    if isinstance(value, BaseModel):
        return _model_settings(value, depth)
    if callable(value):
        try:
            return callable_identity(value, depth)
        except Unkeyable:
            raise
        except Exception as exc:  # a state that fails to read keys nothing: no cache
            raise Unkeyable(f"{value!r} cannot be read for a cache key ({exc})") from exc
    return _SKIP


def callable_identity(value: Any, depth: int, within: frozenset[int] = frozenset()) -> Any:
    """What a callable field contributes to the key: its qualified name and what it
    computes with, all of it read in full (`_exact`), so two lambdas, two closures of
    one factory over other strings or two partials never share a key:

    - a function: its code (bytecode, names, constants, nested code), defaults, closure
      values, and every global name its code reads (``co_names``) resolved in its
      ``__globals__``: data by value, objects by their state (as a closure's), a
      module by the attributes of it the code names (``CONF.lang``, ``cfg.LANG``), a
      function of the same module by its own identity (so a redefined helper changes
      the key); the classes, and the functions and modules of other modules, by name;
      a read of the process environment keys the variables the code names
      (``os.environ.get("X")``, ``os.environ["X"]``, ``os.getenv("X")``: their values,
      unset apart from empty), any other read of it the whole environment
      (`environment_reads`);
    - a bound built-in method (``"EN {}".format``, ``{...}.get``, ``pattern.sub``): its
      object (`_exact`) and name; a ``partial``: its function and arguments; a bound
      method: its function and object; a callable object: its class and attributes.

    Anything with no plain form raises `Unkeyable`: the transform is then not cached
    (an identity such as ``id()`` is reused once the object is gone). ``within``: the
    functions being keyed, so a recursive helper is keyed once.

    Args:
        value: The callable.
        depth: How deep in the key it is (past `_MAX_DEPTH`: `Unkeyable`).
        within: See above."""
    name = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
    if isinstance(value, type):
        return name
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return f"{value.__objclass__.__qualname__}.{value.__name__}"  # str.format, unbound
    if inspect.isbuiltin(value):
        owner = value.__self__
        if owner is None or isinstance(owner, types.ModuleType):
            return name  # len, math.sqrt: a built-in function
        return f"{name}#{_digest(_exact(owner, depth))}"  # a built-in bound to its data
    if isinstance(value, functools.partial):
        return ["partial", *(_exact(v, depth) for v in (value.func, value.args, value.keywords))]
    if inspect.ismethod(value):
        return [_exact(value.__func__, depth), _exact_object(value.__self__, depth)]
    if not inspect.isfunction(value):  # an object with __call__: its class and state
        return _exact_object(value, depth)
    return _function_identity(value, name, depth, within)


def _function_identity(value: Any, name: str, depth: int, within: frozenset[int]) -> str:
    """`callable_identity` of a plain function. One that holds and reads nothing but
    its code (no closure, no defaults, no global of its module read: a formatter
    lambda) is read once per code object (`_pure_memo`): what it computes cannot
    change while its code does not."""
    code = value.__code__
    code_part, names, env = _code_read(code, depth)  # immutable: read once
    pure = not (value.__closure__ or value.__defaults__ or value.__kwdefaults__)
    pure = pure and names.isdisjoint(value.__globals__)
    if pure:
        known = _pure_memo.get(id(code))
        if known is not None and known[0] is code and known[1:3] == (depth, name):
            return known[3]
    cells = [c.cell_contents for c in (value.__closure__ or ()) if _filled(c)]
    keywords = value.__kwdefaults__ or {}
    parts = [_exact(v, depth) for v in (*cells, *(value.__defaults__ or ()))]
    parts.append(_exact(keywords, depth))
    within = within | {id(value)}
    reads = [
        [n, _global_form(value.__globals__[n], value, (names, env), depth, within)]
        for n in sorted(names)
        if n in value.__globals__
    ]
    parts.append(reads)  # the globals it reads (a template, a table, a config object)
    text = "[" + ", ".join([code_part, *map(repr, parts)]) + "]"  # repr([code, *parts])
    identity = f"{name}#{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if pure:
        if len(_pure_memo) >= _CODE_MEMO_SIZE:
            _pure_memo.clear()
        _pure_memo[id(code)] = (code, depth, name, identity)
    return identity


_pure_memo: dict[int, tuple[CodeType, int, str, str]] = {}
"""`_function_identity` of functions that read nothing but their code, by their code
object's id (the entry holds the code object, so the id is never reused meanwhile)."""


def _digest(parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


_Reads = tuple[frozenset[str], "frozenset[str] | None"]
"""What a function's code reads: its global names, and the environment variables it
names (None: it reads the environment some other way; `environment_reads`)."""


def _global_form(value: Any, reader: Any, reads: _Reads, depth: int, within: frozenset[int]) -> Any:
    """A global that function ``reader`` reads (``reads``: what its code names), for
    its key (see `callable_identity`)."""
    if _is_environment(value):
        return _environment_form(reads[1], depth)
    if isinstance(value, types.ModuleType):
        attrs = vars(value)
        return [
            value.__name__,
            [
                [n, _module_attr_form(attrs[n], reads, depth)]
                for n in sorted(reads[0])
                if n in attrs
            ],
        ]
    if inspect.isfunction(value):
        same_module = value.__module__ == reader.__module__
        if same_module and id(value) not in within:
            return callable_identity(value, depth + 1, within)
        return f"{value.__module__}.{value.__qualname__}"
    return _exact(value, depth)


def _module_attr_form(value: Any, reads: _Reads, depth: int) -> Any:
    """An attribute read through a module (``cfg.LANG``): data and objects by value;
    modules, classes and functions by name (the functions a function calls are code,
    keyed by name); the process environment as `_environment_form`."""
    if _is_environment(value):
        return _environment_form(reads[1], depth)
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, type) or inspect.isfunction(value) or inspect.isbuiltin(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
    return _exact(value, depth)


def _is_environment(value: Any) -> bool:
    return value is os.environ or value is os.getenv or value is getattr(os, "environb", None)


def _environment_form(variables: frozenset[str] | None, depth: int) -> Any:
    """The process environment as a function reads it: the variables it names (an
    unset one as None, apart from an empty one), or, when it reads the environment
    any other way, all of it."""
    if variables is None:
        return ["environ", _exact(dict(os.environ), depth)]
    return ["environ-vars", [[name, os.environ.get(name)] for name in sorted(variables)]]


_ENV_NAMES = frozenset({"environ", "getenv", "environb"})
_CALLS = frozenset({"CALL", "PRECALL", "CALL_FUNCTION", "CALL_METHOD"})


def environment_reads(code: CodeType) -> frozenset[str] | None:
    """The environment variables ``code`` (and the code nested in it) reads, when
    each read is ``os.environ.get("X"[, default])``, ``os.environ["X"]`` or
    ``os.getenv("X"[, default])`` with a constant name (the module or the function
    by any global name: ``environ.get("X")`` after ``from os import environ``); None
    when any use of a name `_ENV_NAMES` holds is something else (a computed name,
    ``dict(os.environ)``, ``"X" in os.environ``): then the whole environment counts.
    Read by name, not by value: a name that is not the environment's costs nothing,
    as `_global_form` keys the environment only where the value is it.

    Args:
        code: A function's code object."""
    ops = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    found: set[str] = set()
    for at, op in enumerate(ops):
        if op.argval not in _ENV_NAMES or not op.opname.startswith("LOAD_"):
            continue
        name = _named_variable(code, ops, at)
        if name is None:
            return None
        found.add(name)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            nested = environment_reads(const)
            if nested is None:
                return None
            found |= nested
    return frozenset(found)


def _named_variable(code: CodeType, ops: list[dis.Instruction], at: int) -> str | None:
    """The variable the environment read at ``ops[at]`` names, or None when it is no
    read of a constant name (see `environment_reads`)."""
    after = [*ops[at + 1 : at + 6], None, None, None, None]
    first = after[0]
    if ops[at].argval == "environ" and first is not None and first.opname.startswith("LOAD_"):
        if first.opname != "LOAD_CONST" and first.argval == "get":
            after, first = after[1:], after[1]  # environ.get(...): the call's arguments
        elif first.opname == "LOAD_CONST" and _subscript(after[1]):
            return first.argval if isinstance(first.argval, str) else None  # environ["X"]
        else:
            return None
    elif ops[at].argval != "getenv":
        return None
    if first is None or first.opname != "LOAD_CONST" or not isinstance(first.argval, str):
        return None
    rest = after[1:]
    if rest[0] is not None and rest[0].opname == "LOAD_CONST":  # a constant default
        rest = rest[1:]
        if rest[0] is not None and rest[0].opname == "KW_NAMES":
            if code.co_consts[rest[0].arg or 0] != ("default",):
                return None
            rest = rest[1:]
    return first.argval if rest[0] is not None and rest[0].opname in _CALLS else None


def _subscript(op: dis.Instruction | None) -> bool:
    return op is not None and (
        op.opname == "BINARY_SUBSCR" or (op.opname == "BINARY_OP" and op.argrepr == "[]")
    )


_BIG_ARRAY = 4096
"""Elements above which a numpy array enters a key by the hash of its bytes."""


def _exact(value: Any, depth: int) -> Any:
    """``value`` as plain data with nothing left out (what a callable computes with), or
    `Unkeyable` when any part of it has no plain form. Unlike settings (`_plain`),
    nothing is dropped: a dropped part could be the one that differs."""
    if type(value) in _SCALARS:
        return value  # the common case first: ABC checks cost most of a big table's read
    if depth > _MAX_DEPTH:
        raise Unkeyable("nested too deep for a cache key")
    depth += 1
    if isinstance(value, enum.Enum):
        value = value.value
    elif isinstance(value, os.PathLike):
        value = os.fspath(value)
    if type(value).__module__ == "numpy" and callable(getattr(value, "tobytes", None)):
        if getattr(value, "dtype", None) is not None and value.dtype.hasobject:
            return [_exact(v, depth) for v in value.tolist()]
        if getattr(value, "size", 0) > _BIG_ARRAY:
            digest = hashlib.sha256(value.tobytes()).hexdigest()
            return ["ndarray", str(value.dtype), list(value.shape), digest]
        value = value.tolist()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return ["bytes", hashlib.sha256(value).hexdigest()]
    if isinstance(value, re.Pattern):
        return ["re", _exact(value.pattern, depth), value.flags]
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if _len_of(value) > _BIG_TABLE:
        table = _scalar_table(value)
        if table is not None:
            return table
    if isinstance(value, (list, tuple)):
        return [_exact(v, depth) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_exact(v, depth) for v in value), key=repr)
    if isinstance(value, Mapping):
        items = [[_exact(k, depth), _exact(v, depth)] for k, v in value.items()]
        return sorted(items, key=repr)
    if callable(value) and not isinstance(value, BaseModel):
        return callable_identity(value, depth)
    return _exact_object(value, depth)


_BIG_TABLE = 256
"""Entries above which a list, tuple or dict of scalars enters a key by a digest."""


def _len_of(value: Any) -> int:
    """``len(value)`` for a built-in list, tuple or dict, else 0."""
    return len(value) if type(value) in (list, tuple, dict) else 0


def _scalar_table(value: list[Any] | tuple[Any, ...] | dict[Any, Any]) -> list[Any] | None:
    """A big list, tuple or dict of scalars (`_SCALARS`; a dict's keys strings) as
    its kind, length and the digest of its sorted repr (what `_exact` would list, in
    a tenth of the time: round 7's 20,000-entry table); None for any other."""
    if type(value) is dict:
        if not all(type(k) is str for k in value) or not _all_scalars(value.values()):
            return None
        text = repr(sorted(value.items()))  # keys unique: values are never compared
    elif _all_scalars(value):
        text = repr(list(value))
    else:
        return None
    digest = hashlib.sha256(text.encode()).hexdigest()
    return ["table", type(value).__name__ == "dict", len(value), digest]


def _all_scalars(values: Any) -> bool:
    return all(type(v) in _SCALARS for v in values)


def _exact_object(obj: Any, depth: int) -> Any:
    """An object as its class and every attribute (a pydantic model's fields, private
    attributes and extras included), read by `_exact`; `Unkeyable` without them."""
    kind = type(obj)
    state: dict[str, Any] = {}
    if isinstance(obj, BaseModel):
        state.update(dict(obj))
        state.update(getattr(obj, "__pydantic_private__", None) or {})
        state.update(getattr(obj, "__pydantic_extra__", None) or {})
    elif isinstance(getattr(obj, "__dict__", None), dict) and not hasattr(kind, "__slots__"):
        state.update(vars(obj))
    else:
        raise Unkeyable(f"{kind.__qualname__} has no plain form for a cache key")
    shared = {  # data a class of the caller's own holds for every instance (a factory's)
        k: v
        for cls in kind.__mro__
        if cls.__module__ not in ("builtins", "pydantic.main")
        and not cls.__module__.startswith(("llama_index.", "pydantic"))
        for k, v in vars(cls).items()
        if not k.startswith("__") and isinstance(v, _DATA)
    }
    return [f"{kind.__module__}.{kind.__qualname__}", _exact(state, depth), _exact(shared, depth)]


_DATA = (str, int, float, bool, bytes, tuple, list, dict, set, frozenset, type(None))
"""Class attributes that are data (not methods or descriptors), read into a key."""


def _code_identity(code: CodeType, depth: int) -> Any:
    """A code object as plain data: its bytecode, the names it uses and its constants,
    nested code included."""
    consts = [
        _code_identity(c, depth) if isinstance(c, CodeType) else _exact(c, depth)
        for c in code.co_consts
    ]
    return [code.co_code.hex(), list(code.co_names), consts]


_CODE_MEMO_SIZE = 1024
_code_memo: dict[int, tuple[CodeType, int, str, frozenset[str], frozenset[str] | None]] = {}
"""What `_code_read` read of a code object, by its id: the entry holds the code
object itself, so an id is never reused while its entry is kept."""


def _code_read(code: CodeType, depth: int) -> tuple[str, frozenset[str], frozenset[str] | None]:
    """``repr(_code_identity(code, depth))``, the global names the code reads
    (`_names_used`) and the environment variables it names (`environment_reads`):
    pure functions of an immutable code object, read once (hashing its bytecode was
    most of a cache key's cost). Looked up by identity, not by the code's own hash,
    which reads all of it again."""
    known = _code_memo.get(id(code))
    if known is not None and known[0] is code and known[1] == depth:
        return known[2], known[3], known[4]
    read = repr(_code_identity(code, depth)), _names_used(code), environment_reads(code)
    if len(_code_memo) >= _CODE_MEMO_SIZE:
        _code_memo.clear()
    _code_memo[id(code)] = (code, depth, *read)
    return read


def _names_used(code: CodeType) -> frozenset[str]:
    """The global names ``code`` and the code nested in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _names_used(const)
    return frozenset(names)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True
