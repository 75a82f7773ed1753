"""How a Milvus build replaces the collection a name serves, never touching another's.

The name a user gives (``collection``) is an alias of the build holding the data,
``<collection>__<12 hex>``: a build fills a new one beside the old, moves the alias in
one step, then drops the builds it replaced. Beside a Milvus Lite file a record
(``<uri>.<collection>.hyde_plus.json``) lists each build before it exists; a rebuild
drops only those (on a server, the build the alias pointed at), keeps one with another
alias (the user's pin), and reads no rows back. A name that is the user's is refused.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._owned import write_all_atomic
from .._redact import redact_uri

logger = logging.getLogger(__name__)


def is_local_uri(uri: str) -> bool:
    """A Milvus Lite file (not ``http://``, ``https://`` or ``tcp://``)."""
    return "://" not in uri


def record_path(uri: str, collection: str) -> Path | None:
    """Where the record of ``collection``'s builds is kept (None on a server)."""
    return Path(f"{uri}.{collection}.hyde_plus.json") if is_local_uri(uri) else None


def is_build_of(name: str, collection: str) -> bool:
    """Whether ``name`` is named as a build behind the alias ``collection`` would be."""
    return re.fullmatch(re.escape(collection) + r"__[0-9a-f]{12}", name) is not None


def drop_command(uri: str, name: str) -> str:
    """The one-line command that drops the collection ``name`` at ``uri``: no hyde-plus
    command drops a collection it keeps, so every message about one says how."""
    where = str(Path(uri).expanduser()) if is_local_uri(uri) else redact_uri(uri)
    code = f"MilvusClient({json.dumps(where)}).drop_collection({json.dumps(name)})"
    return f"python -c {shlex.quote('from pymilvus import MilvusClient; ' + code)}"


def alias_of(client: Any, alias: str) -> str | None:
    """The collection the alias ``alias`` points at, whoever made it (None: no such alias)."""
    aliases = client.list_aliases().get("aliases") or []
    return str(client.describe_alias(alias)["collection_name"]) if alias in aliases else None


def resolve(client: Any, collection: str) -> str | None:
    """The collection holding ``collection``'s data: the build its alias points at, or
    a collection of that very name (None: neither)."""
    target = alias_of(client, collection)
    if target is not None and is_build_of(target, collection):
        return target
    return collection if collection in client.list_collections() else None


def check_name_is_ours(client: Any, uri: str, collection: str) -> None:
    """A `ValueError` when ``collection`` is the user's: a collection of that very
    name, or an alias of one hyde-plus did not build (or that its record does not list)."""
    target, path = alias_of(client, collection), record_path(uri, collection)
    if target is None:
        theirs, what = collection in client.list_collections(), f"a collection {collection!r}"
    else:
        listed = not (path and path.exists()) or target in recorded_builds(uri, collection)
        theirs = not (is_build_of(target, collection) and listed)
        what = f"an alias {collection!r} (of {target!r})"
    if theirs:
        raise ValueError(
            f"{redact_uri(uri)} already has {what} that hyde-plus did not make (or its "
            "record does not list); it is left alone: choose another --collection"
        )


def fill_and_switch(
    client: Any, where: tuple[str, str], entry: dict[str, Any], fill: Callable[[str], Any]
) -> Any:
    """Record a new build of ``where`` (the URI and the alias), ``fill`` it (create the
    collection it is given and write the rows; its result is returned), move the alias
    to it, drop the builds it replaced. A failure before the switch drops the new one."""
    uri, collection = where
    before = resolve(client, collection)
    physical = f"{collection}__{uuid.uuid4().hex[:12]}"
    entry = {**entry, "physical_collection": physical}
    update_record(uri, collection, {physical: {**entry, "writing": True}})
    try:
        result = fill(physical)
        update_record(uri, collection, {physical: entry})
        switch_alias(client, collection, physical)
    except BaseException:
        try:
            if resolve(client, collection) != physical:  # the alias does not serve it
                if physical in client.list_collections():
                    client.drop_collection(physical)
                update_record(uri, collection, {physical: None})
        except Exception as exc:  # the build's own error is the one to report
            logger.warning("could not clean up the failed build %s: %s", physical, exc)
        raise
    _drop_replaced(client, where, physical, before)
    return result


def switch_alias(client: Any, alias: str, physical: str) -> None:
    """Point ``alias`` at ``physical`` in one step. Only an alias of one of our builds
    is moved; otherwise it is created, which fails if someone made it meanwhile."""
    if resolve(client, alias) not in (None, alias):  # the alias serves one of our builds
        client.alter_alias(physical, alias)  # atomic: queries see the old or the new
    else:
        client.create_alias(physical, alias)


def _drop_replaced(client: Any, where: tuple[str, str], physical: str, before: str | None) -> None:
    """Drop and unrecord the builds ``physical`` replaced: those the record lists (on a
    server, the one the alias pointed at ``before``). One the record does not list, one
    with another alias (the user's pin) or one Milvus fails to drop is kept (and stays
    recorded), with a warning saying how to drop it."""
    uri, collection = where
    path = record_path(uri, collection)
    served = {before} if before else set()
    listed = set(recorded_builds(uri, collection)) if path else served
    gone = listed - {physical}  # unrecorded at the end, but for the builds kept
    for name in sorted(((listed | served) - {physical}) & set(client.list_collections())):
        if not is_build_of(name, collection):
            continue
        try:
            aliases = set(client.list_aliases(collection_name=name).get("aliases") or [])
            if name not in listed:
                why = f"the alias {collection!r} pointed at it; the record {path} does not list it"
            elif pins := ", ".join(sorted(aliases - {collection})):
                why = f"it carries the alias(es) {pins} (the next build drops it once you drop "
                why += "them)"
            else:
                client.drop_collection(name)
                continue
        except Exception as exc:
            why = f"Milvus could not drop it ({getattr(exc, 'message', '') or exc})"
        gone.discard(name)
        logger.warning(
            "kept the replaced build %s of collection %r: %s; drop it yourself when you "
            "no longer need it: %s",
            *(name, collection, why, drop_command(uri, name)),
        )
    update_record(uri, collection, dict.fromkeys(gone))


def recorded_builds(uri: str, collection: str) -> dict[str, Any]:
    """The builds the record lists, with what it says of each ({} without a record)."""
    path = record_path(uri, collection)
    return dict(read_record(path).get("collections") or {}) if path else {}


def read_record(path: Path) -> dict[str, Any]:
    """The record at ``path`` ({} when there is none); a `ValueError` saying what to do
    when it is damaged or not one `update_record` writes (a user's file or a link)."""
    if not (path.exists() or path.is_symlink()):
        return {}
    data: Any = None
    why = "not a record hyde-plus writes"
    try:
        if path.is_file() and not path.is_symlink():
            data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        why = str(exc)
    ours = isinstance(data, dict) and isinstance(data.get("collections"), dict)
    if not ours or data.get("format") != 2:
        raise ValueError(
            f"{path} is not hyde-plus's record of the collection, or is corrupt ({why}): "
            f"move it aside (say to {path.name}.bad) and rebuild with `hyde-plus index "
            "DIR --store milvus` and the same --uri and --collection (the rebuild keeps "
            "the collection served until now, for you to drop), or choose another --collection"
        )
    return dict(data)


def update_record(uri: str, collection: str, changes: dict[str, Any]) -> None:
    """Set (``None``: remove) the record's entries of the builds ``changes`` names,
    atomically; its other entries, and the keys the user added to it, stay."""
    path = record_path(uri, collection)
    if path is not None:
        data = read_record(path)
        entries = {**(data.get("collections") or {}), **changes}
        entries = {k: v for k, v in entries.items() if v is not None}
        data = {**data, "format": 2, "collections": entries}
        write_all_atomic([(path, json.dumps(data, indent=2))])
