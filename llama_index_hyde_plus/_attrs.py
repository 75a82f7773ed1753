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
