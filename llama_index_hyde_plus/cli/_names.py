"""The names and defaults the command line offers, without importing what they name.

The CLI parses and checks its arguments (and answers ``--help``) from this module alone,
before LlamaIndex loads (seconds on a small machine). Each value is a copy of one in a
module that imports LlamaIndex: the transform registry, the store list, the chunking
defaults, the timeout policy. ``tests/test_cli_fast.py`` checks every copy against its
source, so a new transform or store that is not named here fails a test.
"""

from __future__ import annotations

from .._suggest import did_you_mean

TRANSFORMS: tuple[str, ...] = (
    "none",
    "hyde",
    "multi-query",
    "step-back",
    "decompose",
    "rewrite",
    "rocchio",
    "condense",
)
"""`transforms.registry.TRANSFORMS`: every transform name, the baseline first."""

METHODS: tuple[str, ...] = (
    "hyde",
    "multi-query",
    "step-back",
    "decompose",
    "rewrite",
    "condense",
)
"""`transforms.registry.METHODS`: the transforms that call an LLM."""

SPELLINGS: dict[str, str] = {"multiquery": "multi-query", "stepback": "step-back"}
"""Other spellings `transforms.registry.transform_class` forgives."""

SESSIONLESS: tuple[str, ...] = ("stateless", "shared")
"""`rcp.Sessionless`: what an HTTP server does with requests that carry no session."""

STORE_KINDS: tuple[str, ...] = ("faiss", "milvus")
"""`stores.STORE_KINDS`: the ``--store`` choices."""

DEFAULT_CHUNK_SIZE = 200
"""`chunking.DEFAULT_CHUNK_SIZE`."""
DEFAULT_CHUNK_OVERLAP = 20
"""`chunking.DEFAULT_CHUNK_OVERLAP`."""

TIMEOUT_POLICY = "by the model: local 10 s + max_tokens x slots / 8 tokens/s, remote 30 s"
"""`timeouts.POLICY`: the default timeout rule in words, for ``--help``."""


def transform_name(name: str) -> str:
    """The name in `TRANSFORMS` that ``name`` spells (case, ``_`` for ``-`` and the
    `SPELLINGS` forgiven, as `transforms.registry.transform_class` does); a
    `ValueError` with the closest names otherwise."""
    key = name.strip().lower().replace("_", "-")
    key = SPELLINGS.get(key, key)
    if key not in TRANSFORMS:
        raise ValueError(
            f"unknown transform {name!r}{did_you_mean(name, TRANSFORMS)}; "
            f"choose one of: {', '.join(TRANSFORMS)}"
        )
    return key
