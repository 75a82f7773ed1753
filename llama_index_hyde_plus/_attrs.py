"""Reading an attribute an object may not have, as ``getattr(obj, name, default)``
does, without a failed lookup where the object's class can tell at once.

A pydantic model (LlamaIndex's LLMs are ones) answers a name it lacks by raising from
its own ``__getattr__`` with a formatted message, about 2.4 µs a time here, and each
LLM call asks several (``loaded``, ``max_retries``, ``timeout``, ``request_timeout``,
``max_tokens``, the provider's endpoint). An instance of such a class holds a name
only in its ``__dict__`` or as a class attribute, unless the class allows extra fields
or another ``__getattr__`` or ``__getattribute__`` answers: for the plain ones a
missing name costs two dict lookups.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


def optional_attr(obj: object, name: str, default: Any = None) -> Any:
    """``getattr(obj, name, default)``, the same value (a property that raises still
    raises), without asking a plain pydantic model for a name it cannot have.

    Args:
        obj: any object.
        name: the attribute.
        default: what a missing attribute reads as.
    """
    kind: Any = type(obj)  # a class is hashable (typing's object.__hash__ says otherwise)
    if _only_in_dict(kind, name):
        return obj.__dict__.get(name, default)
    return getattr(obj, name, default)


@functools.lru_cache(maxsize=1024)
def _only_in_dict(kind: type, name: str) -> bool:
    """Whether an instance of ``kind`` can hold ``name`` only in its ``__dict__``: a
    pydantic model with no extra fields, whose only ``__getattr__`` is pydantic's, with
    no ``__getattribute__`` of its own and no class attribute ``name``."""
    from pydantic import BaseModel  # here: importing this module costs nothing

    if not issubclass(kind, BaseModel) or kind.model_config.get("extra") == "allow":
        return False
    if name.startswith("_") or hasattr(kind, name):
        return False  # private attributes live elsewhere; class attributes may compute
    mro = kind.__mro__
    getattr_owner = next(c for c in mro if "__getattr__" in vars(c))
    getattribute_owner = next(c for c in mro if "__getattribute__" in vars(c))
    return getattr_owner is BaseModel and getattribute_owner is object


def overrides(obj: object, name: str, base: type) -> bool:
    """Whether ``obj``'s method ``name`` is its own rather than ``base``'s default (a
    native ``acomplete``, ``_aretrieve``, ``_aget_query_embedding`` rather than the
    base class's one that calls the blocking method).

    The class asked is the one ``obj`` reports (``obj.__class__``), so a transparent
    proxy (``wrapt.ObjectProxy``) answers for the object it wraps. An object whose
    class does not show the method (a wrapper that hands attributes on with
    ``__getattr__``, a function set on the instance) answers through the method it
    returns: a bound method is asked of the object it is bound to, a plain function
    counts as native when it is a coroutine function.

    Args:
        obj: the model, retriever or postprocessor.
        name: the method's name.
        base: the class whose own definition of ``name`` is not native.
    """
    kind: Any = obj.__class__  # hashable (typing's object.__hash__ says otherwise)
    if not isinstance(kind, type):
        kind = type(obj)
    owner = _owner(kind, name)
    if owner is not None:
        return not issubclass(base, owner)
    found = getattr(obj, name, None)
    bound_to = getattr(found, "__self__", None)
    if bound_to is not None and bound_to is not obj:
        return overrides(bound_to, name, base)
    return inspect.iscoroutinefunction(found)


def defining_class(obj: object, name: str) -> type | None:
    """The class whose own definition of ``name`` ``obj`` uses (the class ``obj``
    reports, as `overrides` asks), or None when no class of it defines ``name``."""
    kind: Any = obj.__class__
    return _owner(kind if isinstance(kind, type) else type(obj), name)


@functools.lru_cache(maxsize=1024)
def _owner(kind: type, name: str) -> type | None:
    """The first class of ``kind``'s MRO that defines ``name`` itself, or None."""
    return next((k for k in kind.__mro__ if name in vars(k)), None)
