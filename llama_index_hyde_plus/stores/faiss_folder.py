"""The on-disk layout of a FAISS index folder, and how a build replaces one.

An index folder (owned as `_owned` says) holds ``hyde_plus.json`` (how it was
embedded; the data folder in use), the data folder ``data-<12 hex>`` (LlamaIndex's
storage files; in ``ingestion/`` the pipeline's docstore) and the link ``current`` to
it. The metadata names a build's data folder (``pending``, then ``replaced`` for the
old) before it exists and until it is deleted, so a kill leaves the old index whole and
the next build deletes only what those keys name. The pipeline's cache is kept until
the switch (``ingestion_cache.json``), so a failed build embeds nothing again.
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
INGESTION_CHUNKS = "ingestion/chunks.json"
"""The chunks the build wrote, with their hashes (`ingestion.recorded`), inside a data
folder: a chunk edited there since is not reused."""
CACHE_FILE = "ingestion_cache.json"
"""The pipeline's cache in the index folder while a build is not switched in."""
_DATA_NAME = re.compile(r"data-[0-9a-f]{12}")


def check_index_target(out: Path, docs: Path | None = None) -> Path:
    """``out`` resolved, if an index may be written there (`check_folder`; not the
    documents folder ``docs``, above or inside it; its ``current`` a link if present);
    else a `ValueError` saying why."""
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
    chunks: dict[str, list[str]] | None = None,
    cache: bytes | None = None,
    unchanged: bool = False,
) -> None:
    """Write the storage files (and the pipeline's ``docstore``, the ``chunks`` it
    records) into a new data folder of ``out`` and switch ``hyde_plus.json`` to it with
    one atomic rename, keeping ``cache`` (the pipeline's, when the build embedded) until
    then. Replacing a build is a warning, unless the new one is ``unchanged`` (the same
    chunks and vectors)."""
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
            _persist(out / data, storage, docstore, chunks)
        except BaseException:
            _undo(out, data, None if old else (marked, made))
            raise
        previous, meta = old.get("data"), {**old, **meta, "data": data}
        write_all_atomic([(out / META_FILE, json.dumps({**meta, "replaced": previous}, indent=2))])
        point_current(out, data)  # the switch is done: now the old data may go
        if _remove_build(out, previous, keep=data) and not unchanged:
            logger.warning("replaced the index in %s (its previous build %s)", out, previous)
        write_all_atomic([(out / META_FILE, json.dumps(meta, indent=2))])
        (out / CACHE_FILE).unlink(missing_ok=True)  # the build is in: nothing to resume


def _persist(
    folder: Path,
    storage: StorageContext,
    docstore: SimpleDocumentStore | None,
    chunks: dict[str, list[str]] | None,
) -> None:
    folder.mkdir()
    try:
        storage.persist(persist_dir=str(folder))
        if docstore is not None:
            docstore.persist(str(folder / INGESTION_DOCSTORE))
        if chunks is not None:
            (folder / INGESTION_CHUNKS).parent.mkdir(exist_ok=True)
            (folder / INGESTION_CHUNKS).write_text(json.dumps(chunks), encoding="utf-8")
    except RuntimeError as exc:  # FAISS reports a full disk as a RuntimeError
        if "No space left" not in str(exc):
            raise
        raise OSError(errno.ENOSPC, "No space left on device", str(folder)) from exc


def _undo(out: Path, data: str, first: tuple[bool, bool] | None) -> None:
    """Remove a failed build's data folder; after a failed first build (``first``:
    whether it marked the folder, and made it) also what it wrote there, or the folder."""
    _remove_build(out, data)
    if first is not None:
        try:
            for name in (META_FILE, CACHE_FILE, *([MARKER] if first[0] else [])):
                (out / name).unlink(missing_ok=True)
            if first[1]:
                out.rmdir()
        except OSError as exc:  # the build's own error is the one to report
            logger.warning("could not undo the failed build in %s: %s", out, exc)


def _remove_build(out: Path, name: object, keep: object = None) -> bool:
    """Delete the data folder ``name`` the metadata gave (never ``keep``, the one in
    use; only a real folder ``data-<12 hex>``); whether there was one."""
    folder = out / name if isinstance(name, str) and _DATA_NAME.fullmatch(name) else None
    if folder is None or name == keep or folder.is_symlink() or not folder.is_dir():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def point_current(out: Path, data: str) -> None:
    """Point ``out/current`` at ``out/data`` in one step (a new link renamed over it)."""
    pending = out / f".{CURRENT_LINK}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        pending.symlink_to(data, target_is_directory=True)
        os.replace(pending, out / CURRENT_LINK)
    except OSError as exc:  # a file system without links: the metadata still names it
        pending.unlink(missing_ok=True)
        logger.warning("could not link %s to %s (%s)", out / CURRENT_LINK, data, exc)
