"""The on-disk layout of a FAISS index folder, and how a build replaces one.

An index folder carries the marker ``.hyde-plus`` (`_owned`), ``hyde_plus.json`` (how
it was embedded, and which data folder is in use), the data folder ``data-<12 hex>``
with LlamaIndex's storage files (and, in ``ingestion/``, the docstore of the
`ingestion` pipeline that tells the next build what changed), and the link ``current``
to it. A build names its new data folder in the metadata (``pending``) before writing
it, writes it beside the one in use, and switches by renaming the new metadata (naming
the old data folder as ``replaced`` until it is deleted) over the old: a kill at any
point leaves the previous index whole. The next build deletes what a killed or failed
one left (``pending``, ``replaced``), and nothing else; any other key in the metadata
is carried over. Builds in one parent folder write one at a time. A build that
embedded something saves the pipeline's cache (``ingestion_cache.json``) before it
writes its data folder and deletes it once the switch is done: a build that failed or
was killed after embedding is run again without embedding again.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from llama_index.core import StorageContext
from llama_index.core.storage.docstore import SimpleDocumentStore

from .._owned import MARKER, check_folder, check_outputs, claim, locked_folder, write_all_atomic

logger = logging.getLogger(__name__)

KIND = "index"
META_FILE = "hyde_plus.json"
CURRENT_LINK = "current"
"""The link inside an index folder to its data folder in use: a stable path that plain
LlamaIndex opens (``StorageContext.from_defaults(persist_dir=...)``)."""
INGESTION_DOCSTORE = "ingestion/docstore.json"
"""The pipeline's docstore (documents and their hashes) inside a data folder."""
CACHE_FILE = "ingestion_cache.json"
"""The pipeline's cache in the index folder while a build is not switched in."""
_DATA_NAME = re.compile(r"data-[0-9a-f]{12}")


def check_index_target(out: Path, docs: Path | None = None) -> Path:
    """``out`` resolved, if an index may be written there (absent, empty, or an index
    hyde-plus built: `check_folder`); else a `ValueError` saying why. It may not be the
    documents folder ``docs``, a folder above it, or one inside it, and a ``current``
    in it that is not a link (a user's file or folder) is in the way."""
    target = check_folder(out, KIND, "--out").resolve()
    source = docs.expanduser().resolve() if docs is not None else None
    if source is not None and (target in (source, *source.parents) or source in target.parents):
        raise ValueError(
            f"--out {out} is, holds or is inside the documents folder {docs} (a build would "
            "read the index's own files as documents); write it to a separate folder"
        )
    link = target / CURRENT_LINK
    if link.exists() and not link.is_symlink():
        raise ValueError(
            f"--out {out}: {link} is not the link hyde-plus makes (a copy made with "
            "copytree?); it is left alone: remove it, then build again"
        )
    check_outputs([target / CACHE_FILE], "--out")
    return target


def write_index(
    out: Path,
    storage: StorageContext,
    meta: dict[str, Any],
    *,
    docstore: SimpleDocumentStore | None = None,
    cache: bytes | None = None,
) -> None:
    """Write the storage files (and the pipeline's ``docstore``) into a new data folder
    of ``out`` and switch ``hyde_plus.json`` to it with one atomic rename; ``cache``
    (the pipeline's, when the build embedded) is kept until the switch (see the
    module's docstring)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked_folder(out.parent):
        check_index_target(out)  # again, now that no other build runs
        made = not out.exists()
        marked = claim(out, KIND)
        try:
            old = dict(json.loads((out / META_FILE).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, RecursionError):  # missing or damaged
            old = {}
        for leftover in ("pending", "replaced"):  # what a killed or failed build left
            _remove_build(out, old.pop(leftover, None), keep=old.get("data"))
        data = f"data-{uuid.uuid4().hex[:12]}"
        try:
            if cache is not None:
                write_all_atomic([(out / CACHE_FILE, cache)])
        except OSError as exc:  # the cache saves embeddings: the build does not need it
            logger.warning("could not save the ingestion cache in %s: %s", out, exc)
        write_all_atomic([(out / META_FILE, json.dumps({**old, "pending": data}, indent=2))])
        try:
            _persist(out / data, storage, docstore)
        except BaseException:
            _undo(out, data, None if old else (marked, made))
            raise
        previous, meta = old.get("data"), {**old, **meta, "data": data}
        write_all_atomic([(out / META_FILE, json.dumps({**meta, "replaced": previous}, indent=2))])
        point_current(out, data)  # the switch is done: now the old data may go
        if _remove_build(out, previous, keep=data):
            logger.warning("replaced the index in %s (its previous build %s)", out, previous)
        write_all_atomic([(out / META_FILE, json.dumps(meta, indent=2))])
        (out / CACHE_FILE).unlink(missing_ok=True)  # the build is in: nothing to resume


def _persist(folder: Path, storage: StorageContext, docstore: SimpleDocumentStore | None) -> None:
    folder.mkdir()
    try:
        storage.persist(persist_dir=str(folder))
        if docstore is not None:
            docstore.persist(str(folder / INGESTION_DOCSTORE))
    except RuntimeError as exc:  # FAISS reports a full disk as a RuntimeError
        if "No space left" not in str(exc):
            raise
        raise OSError(errno.ENOSPC, "No space left on device", str(folder)) from exc


def _undo(out: Path, data: str, first: tuple[bool, bool] | None) -> None:
    """After a failed build: its data folder removed (the metadata naming it ``pending``
    stays, for the next build). ``first`` (whether a first build marked the folder, and
    made it): the folder is left as empty as it was, or removed, with the cache it saved
    (a rebuild keeps its cache, so running it again embeds nothing again)."""
    _remove_build(out, data)
    if first is None:
        return
    marked, made = first
    try:
        for name in (META_FILE, CACHE_FILE, *([MARKER] if marked else [])):
            (out / name).unlink(missing_ok=True)
        if made:
            out.rmdir()
    except OSError as exc:  # the build's own error is the one to report
        logger.warning("could not undo the failed build in %s: %s", out, exc)


def _remove_build(out: Path, name: object, keep: object = None) -> bool:
    """Delete the data folder ``name`` of ``out`` (a name the metadata gave; never
    ``keep``, the one in use): only a real folder named ``data-<12 hex>``, never a link
    or a path. Whether there was one to delete."""
    if not isinstance(name, str) or not _DATA_NAME.fullmatch(name) or name == keep:
        return False
    folder = out / name
    if not folder.is_dir() or folder.is_symlink():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def point_current(out: Path, data: str) -> None:
    """Point ``out/current`` at ``out/data`` in one step: a new relative link made
    beside it and renamed over it, so a reader sees the old data folder or the new one."""
    pending = out / f".{CURRENT_LINK}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        pending.symlink_to(data, target_is_directory=True)
        os.replace(pending, out / CURRENT_LINK)
    except OSError as exc:  # a file system without links: the metadata still names it
        pending.unlink(missing_ok=True)
        logger.warning("could not link %s to %s (%s)", out / CURRENT_LINK, data, exc)
