"""Hide secrets in what is recorded or shown: a command line (``results.json``,
``results.md``, a tune report) and store locations (a URI may carry a password)."""

from __future__ import annotations

import re
from collections.abc import Sequence

#: Options whose value is a secret, wherever a command line is recorded.
SECRET_OPTIONS = ("--token", "--milvus-token", "--api-key", "--llm-key")
REDACTED = "***"

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]+@")
_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:token|access_token|api_key|apikey|key|password|secret)=)[^&#\s]*"
)


def redact_uri(text: str) -> str:
    """``text`` with any credentials in a URI hidden: the user-info part
    (``https://***@host``) and secret query parameters (``?token=***``)."""
    return _SECRET_QUERY.sub(rf"\g<1>{REDACTED}", _USERINFO.sub(rf"\g<1>{REDACTED}@", text))


def redact_argv(args: Sequence[str]) -> list[str]:
    """``args`` with the value of every `SECRET_OPTIONS` option (``--token X`` or
    ``--token=X``) replaced by `REDACTED`, and credentials in URIs hidden."""
    shown: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            shown.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if name in SECRET_OPTIONS:
            shown.append(f"{name}={REDACTED}" if eq else arg)
            hide_next = not eq
            continue
        shown.append(redact_uri(arg))
    return shown
