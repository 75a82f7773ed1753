"""The on-disk layout of a FAISS index folder, and how a build replaces one safely.

An index folder holds ``hyde_plus.json`` (how it was embedded, and which data folder is
in use), the data folder ``data-<12 hex>`` with LlamaIndex's storage files and a marker
naming it, and the link ``current`` to that data folder. A build writes a new data
folder and switches the metadata file to it with one atomic rename, so an interrupted
build never leaves a half-written index and never loses the previous one.

What a build removes, it recognises by more than a name: a folder is replaced only when
its ``hyde_plus.json`` is one this tool wrote (format, vector size, embedding); a data
folder or a staging folder is deleted only when it holds this tool's marker naming it
and nothing but what a build writes; a draft only when its content is a draft's; files
at the top level never (a format-1 index's storage files stay there, unused);
``current`` is replaced only when it links to one of this tool's data folders (or to
one gone). Builds in the same parent folder write one at a time, saying so when they wait.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from llama_index.core import StorageContext

from .._files import (
    STAGING_MARKER,
    is_marked_staging,
    locked_folder,
    make_folder_beside,
    our_file_name,
    sha256_file,
    write_our_file,
)

logger = logging.getLogger(__name__)

META_FILE = "hyde_plus.json"
CURRENT_LINK = "current"
"""The link inside an index folder to its data folder in use: a stable path that plain
LlamaIndex opens (``StorageContext.from_defaults(persist_dir=...)``); a build switches
it atomically (a new link renamed over it)."""
DATA_MARKER = ".hyde-plus-data"
"""The file inside every data folder a build writes, naming the folder: a data folder is
deleted as stale or replaced only when it holds this file with its own name."""

STORAGE_FILES = frozenset(
    {
        "docstore.json",
        "index_store.json",
        "graph_store.json",
        "default__vector_store.json",
        "image__vector_store.json",
    }
)
"""What a format-1 index kept at its top level (and a data folder holds)."""
_DATA_NAME = re.compile(r"data-[0-9a-f]{12}")
_INDEX_ID = re.compile(r"[0-9a-f]{12}")
_DATA_LABEL = re.compile(
    r"(data-[0-9a-f]{12}) of index ([0-9a-f]{12})"
    r"(?:, files sha256 ([0-9a-f]{64})|(, being written))?"
)
_WRITING = ", being written"
META_KEYS = frozenset(
    {"format", "documents", "chunks", "chunking", "dim", "embed", "embed_model"}
    | {"max_length", "build_seconds", "data", "index_id"}
)
"""The keys a build writes into ``hyde_plus.json`` (any other key is the user's and is
carried over to the next build's metadata)."""


def index_id_of(meta: dict[str, Any] | None) -> str | None:
    """The random id an index keeps across rebuilds (``index_id`` in its metadata),
    which its data folders' markers name: a data folder copied in from another index
    names another id and is never taken for this one's."""
    value = (meta or {}).get("index_id")
    return value if isinstance(value, str) and _INDEX_ID.fullmatch(value) else None


def _data_label(name: str, index_id: str, digest: str | None = None) -> str:
    """The marker text of a data folder: ``being written`` until its files are, then
    the sha256 of them (a marker with neither was written by an older hyde-plus)."""
    label = f"{name} of index {index_id}"
    return f"{label}, files sha256 {digest}" if digest else label + _WRITING


def files_digest(folder: Path) -> str:
    """The sha256 of the names and contents of the files in ``folder`` other than its
    marker: recorded in the marker once the storage files are written, so a data
    folder whose files were edited (or removed) since is recognised as no longer what
    this tool wrote, and kept."""
    outer = hashlib.sha256()
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name == DATA_MARKER:
            continue
        if entry.is_symlink() or not entry.is_file():  # never opened: a FIFO blocks,
            outer.update(f"{entry.name}\0not a regular file\n".encode())  # /dev/zero
            continue  # never ends; a build writes neither
        outer.update(f"{entry.name}\0{sha256_file(entry)}\n".encode())
    return outer.hexdigest()


_META_DRAFT = re.compile(rf"\.{re.escape(META_FILE)}\.[0-9a-f]{{8}}\.tmp")
_LINK_DRAFT = re.compile(rf"\.{CURRENT_LINK}\.[0-9a-f]{{8}}\.tmp")


def is_index_meta(meta: object) -> bool:
    """Whether ``meta`` (a parsed ``hyde_plus.json``) is one this tool wrote: format 1
    or 2, a positive vector size, the embedding spec, and (format 2) its data folder.
    A file that merely has the name (someone's config, invalid JSON) is not."""
    if not isinstance(meta, dict):
        return False
    fmt, dim = meta.get("format"), meta.get("dim")
    return (
        type(fmt) is int
        and fmt in (1, 2)
        and type(dim) is int
        and dim > 0
        and isinstance(meta.get("embed"), str)
        and (fmt == 1 or isinstance(meta.get("data"), str))
    )


def our_meta(folder: Path) -> dict[str, Any] | None:
    """The metadata of ``folder`` when it is an index this tool wrote (a regular
    ``hyde_plus.json`` passing `is_index_meta`), else None. Never raises."""
    meta_path = folder / META_FILE
    try:
        if meta_path.is_symlink() or not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return dict(meta) if is_index_meta(meta) else None


def check_index_target(out: Path, docs: Path | None = None) -> Path:
    """``out`` resolved, if an index may be written there; else a `ValueError` saying why.

    The target must be absent, an empty folder, or an index this tool wrote (see
    `our_meta`): anything else could be someone's files, and a build replaces the
    folder's contents. It may not be the documents folder ``docs``, a folder above it,
    or one inside it.
    """
    target = out.expanduser().resolve()
    if target.exists() and not target.is_dir():
        raise ValueError(
            f"--out {out} is a file, not a folder; give a new or empty folder for the index"
        )
    if docs is not None:
        source = docs.expanduser().resolve()
        if target == source or target in source.parents:
            raise ValueError(
                f"--out {out} is the documents folder or contains it; "
                "write the index to a separate folder"
            )
        if source in target.parents:
            raise ValueError(
                f"--out {out} is inside the documents folder {docs}: the next build would "
                "list the index's own files among the documents; write the index to a "
                "separate folder"
            )
    if target.is_dir() and any(target.iterdir()) and not _replaceable(target):
        what = (
            f"its {META_FILE} is not one hyde-plus wrote or cannot be parsed (if you edited "
            "it, undo the edit or move it aside)"
            if (target / META_FILE).exists() or (target / META_FILE).is_symlink()
            else f"no {META_FILE}"
        )
        if all(_DATA_NAME.fullmatch(e.name) for e in target.iterdir()):
            what += "; it holds data folders only: copies, or what a build killed before its "
            what += "switch left; remove them yourself if they are not needed"
        elif not (target / META_FILE).exists() and (left := _leftovers(target)):
            what += (
                f"; beside other files it holds what an interrupted hyde-plus build left "
                f"({', '.join(left)}): remove those yourself, or move the other files out"
            )
        raise ValueError(
            f"--out {out} is a folder that is neither empty nor a hyde-plus index ({what}); "
            "refusing to replace it: choose a new or empty folder"
        )
    return target


def _leftovers(folder: Path) -> list[str]:
    """The names of the metadata drafts and marked data folders in ``folder`` (hidden
    ones too), for a refusal to name."""
    return sorted(
        e.name
        for e in folder.iterdir()
        if _is_draft(e) or (_DATA_NAME.fullmatch(e.name) and _marker_of(e) is not None)
    )


def _replaceable(folder: Path) -> bool:
    """Whether a build may write into the non-empty ``folder``: an index this tool
    wrote, or a folder holding nothing but what a first build killed before its switch
    left (`killed_first_build`). A folder holding copies of data folders and no
    metadata is not: nothing proves whose they are, so it is refused with what it
    holds, and the user decides."""
    return our_meta(folder) is not None or bool(killed_first_build(folder))


def killed_first_build(folder: Path) -> list[Path]:
    """The entries of ``folder`` (no ``hyde_plus.json``) when every one is what a
    first build killed before its switch left there: metadata drafts, and data folders
    still marked ``being written`` (never in use) or complete and named, with their
    index id, by one of those drafts. Else (anything else in it, or nothing) []."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    drafted = _drafted(folder)
    for entry in entries:
        if _is_draft(entry):
            continue
        match = _marker_of(entry) if _DATA_NAME.fullmatch(entry.name) else None
        if match is None or not _is_data_folder(entry, match.group(2)):
            return []
        if not (match.group(4) or (entry.name, match.group(2)) in drafted):
            return []
    return entries


def pause_for_tests(stage: str) -> None:
    """Test hook: with ``HYDE_PLUS_TEST_PAUSE_BEFORE_SWITCH=FILE`` set, create FILE
    (holding ``stage``) and wait while it exists, so a test can kill the build at
    the moment an interruption would hurt most (new data written, not switched in)."""
    flag = os.environ.get("HYDE_PLUS_TEST_PAUSE_BEFORE_SWITCH")
    if not flag:
        return
    path = Path(flag)
    path.write_text(stage)
    while path.exists():
        time.sleep(0.05)


def write_index(out: Path, storage: StorageContext, meta: dict[str, Any]) -> None:
    """Write the storage files into a fresh data folder and switch ``hyde_plus.json`` to
    it in one atomic rename; the previous index stays whole and usable until then.

    A new target is built in a hidden staging folder beside it and renamed into place;
    an existing index gets the new data folder inside it, then its metadata file is
    replaced atomically, then the old data is removed. Leftovers of interrupted builds
    are removed on the way. Builds beside each other write one at a time.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    waiting = f"waiting for another hyde-plus build in {out.parent} to finish writing"
    with locked_folder(out.parent, on_wait=lambda: logger.warning("%s", waiting)):
        check_index_target(out)  # again, now that no other build runs: it may have changed
        _clean_stale_builds(out)
        try:
            _write_data(out, storage, meta)
        except FileNotFoundError as exc:  # someone removed the staging folder meanwhile
            raise ValueError(
                f"the files of this build of {out} were removed while it wrote them; "
                "the index is as it was; build again"
            ) from exc


def _persist(folder: Path, storage: StorageContext, index_id: str) -> None:
    """The data folder ``folder``: made, marked as this index's, then filled."""
    folder.mkdir()
    write_our_file(folder / DATA_MARKER, _data_label(folder.name, index_id))
    try:
        storage.persist(persist_dir=str(folder))
    except RuntimeError as exc:  # FAISS reports a full disk as a RuntimeError
        if "No space left" not in str(exc):
            raise
        raise OSError(errno.ENOSPC, "No space left on device", str(folder)) from exc
    label = _data_label(folder.name, index_id, files_digest(folder))
    write_our_file(folder / DATA_MARKER, label, replace=True)


def _write_data(out: Path, storage: StorageContext, meta: dict[str, Any]) -> None:
    data = f"data-{uuid.uuid4().hex[:12]}"
    old = (our_meta(out) if out.is_dir() else None) or {}
    index_id = index_id_of(old) or uuid.uuid4().hex[:12]
    yours = {k: v for k, v in old.items() if k not in META_KEYS}  # notes added by hand
    meta = {**yours, **meta, "data": data, "index_id": index_id}
    if out.is_dir():  # ours or empty (`check_index_target`)
        # only what the metadata names is replaced; a data folder `current` was pointed
        # at by hand (a rollback to a copy put back) is kept
        _switch_in_place(out, storage, meta, replaced={str(old.get("data") or "")} - {""})
        return
    tmp = make_folder_beside(out.parent, _staging_prefix(out), marked=True)
    try:
        _persist(tmp / data, storage, index_id)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        point_current(tmp, data, index_id)
        pause_for_tests("faiss")
        try:
            os.rename(tmp, out)  # out is still absent: it appears whole
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            raise ValueError(
                f"{out} was created by someone else while this build ran; it is left as "
                "it is and nothing was written: build again, or choose another --out"
            ) from exc
        _unlink_marker(out)
    finally:
        if _is_our_staging(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _switch_in_place(
    out: Path, storage: StorageContext, meta: dict[str, Any], *, replaced: set[str]
) -> None:
    """Fill ``out`` in place (the folder itself, its permissions, a link to it, stay):
    the new data folder, then the metadata draft renamed over ``hyde_plus.json`` (the
    switch), then the data folders ``replaced`` are cleaned up. A failure before the
    switch (a full disk) removes the new data folder and the draft again, so the folder
    is as it was, never left half-filled."""
    data, index_id = str(meta["data"]), str(meta["index_id"])
    pending = out / f".{META_FILE}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        _persist(out / data, storage, index_id)
        pending.write_text(json.dumps(meta, indent=2))
        pause_for_tests("faiss")
        os.replace(pending, out / META_FILE)  # the switch
    except BaseException:
        pending.unlink(missing_ok=True)
        if _holds_only(out / data, STORAGE_FILES | {DATA_MARKER}):  # made by this call
            shutil.rmtree(out / data, ignore_errors=True)  # and never in use
        raise
    point_current(out, data, index_id)
    _clean_replaced(out, keep=data, index_id=index_id, replaced=replaced)


def point_current(out: Path, data: str, index_id: str) -> None:
    """Point ``out/current`` at ``out/data`` in one step: a new relative link is made
    beside it and renamed over it, so a reader sees the old data folder or the new one,
    never a missing link. A ``current`` that is not a link to a data folder (the user's
    file, folder or link) is left alone, with a warning."""
    link = out / CURRENT_LINK
    if (link.exists() or link.is_symlink()) and _linked_data(out, index_id) is None:
        what = "a link" if link.is_symlink() else "a folder" if link.is_dir() else "a file"
        logger.warning(
            "%s is %s this build did not make (a copy made with copytree? copy indexes "
            "with `cp -r`, which keeps links): it is left alone and still shows the old "
            "data; remove it and rebuild to get the stable path back",
            link,
            what,
        )
        return
    pending = out / f".{CURRENT_LINK}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        pending.symlink_to(data, target_is_directory=True)
        os.replace(pending, link)
    except OSError as exc:  # a file system without links: the metadata still names it
        pending.unlink(missing_ok=True)
        logger.warning("could not link %s to %s (%s)", link, data, exc)


def _linked_data(out: Path, index_id: str | None) -> str | None:
    """The data folder name ``out/current`` links to, if it is what `point_current`
    makes: a link to a plain ``data-<12 hex>`` name holding this index's marker (your
    notes put inside it do not change that), or no longer there. With ``index_id``
    None (a staging folder, checked by its own marker) any index's marker counts."""
    link = out / CURRENT_LINK
    if not link.is_symlink():
        return None
    target = os.readlink(link)
    if not _DATA_NAME.fullmatch(target):
        return None
    folder = out / target
    gone = not (folder.exists() or folder.is_symlink())
    return target if gone or _marked(folder, index_id) else None


def _marked(folder: Path, index_id: str | None) -> bool:
    """Whether ``folder`` (a real folder) holds the data marker naming it and
    ``index_id`` (any index's id when None)."""
    match = _marker_of(folder)
    if match is None:
        return False
    return index_id is None or match.group(2) == index_id


def _marker_of(folder: Path) -> re.Match[str] | None:
    """The parsed data marker of ``folder`` (a real folder) when it names the folder."""
    if folder.is_symlink():
        return None
    match = _DATA_LABEL.fullmatch(our_file_name(folder / DATA_MARKER) or "")
    return match if match is not None and match.group(1) == folder.name else None


def why_not_unedited(folder: Path) -> str:
    """Why the marked data folder ``folder`` cannot be taken for exactly what a build
    wrote ("" when it can): its files differ from the sha256 its marker recorded when
    the build finished writing them, or its marker (an older hyde-plus's) recorded
    none. A folder still marked ``being written`` was never in use: ""."""
    match = _marker_of(folder)
    if match is None or match.group(4):
        return ""
    if match.group(3) is None:
        return (
            "it was written by an older hyde-plus, which recorded no checksum of its "
            "files, so edits cannot be ruled out"
        )
    try:
        same = files_digest(folder) == match.group(3)
    except OSError as exc:
        return f"its files cannot be read ({exc})"
    return "" if same else "its files were changed since hyde-plus wrote them"


def _staging_prefix(out: Path) -> str:
    return f".{out.name}.build-"


def _holds_only(folder: Path, allowed: frozenset[str]) -> bool:
    """Whether every entry of ``folder`` is a regular file named in ``allowed``."""
    try:
        return all(
            e.name in allowed and e.is_file() and not e.is_symlink() for e in folder.iterdir()
        )
    except OSError:
        return False


def _is_data_folder(entry: Path, index_id: str | None) -> bool:
    """Whether ``entry`` is a data folder a build of this index wrote: a real folder
    named ``data-<12 hex>`` holding only storage files and the marker naming it and
    ``index_id`` (None: any index's, only inside a verified staging folder). A folder
    a hand-written ``hyde_plus.json`` names, or one copied from another index, is not."""
    if not _DATA_NAME.fullmatch(entry.name) or not entry.is_dir():
        return False
    if not _marked(entry, index_id):
        return False
    return _holds_only(entry, STORAGE_FILES | {DATA_MARKER}) and not why_not_unedited(entry)


def _is_our_staging(folder: Path) -> bool:
    """A staging folder of a build: marked with its own name, holding nothing but what
    a build writes there (metadata, the link, one data folder)."""
    if not is_marked_staging(folder):
        return False
    try:
        entries = list(folder.iterdir())
    except OSError:
        return False
    for entry in entries:
        name = entry.name
        if name in (STAGING_MARKER, META_FILE) and entry.is_file() and not entry.is_symlink():
            continue
        if name == CURRENT_LINK and _linked_data(folder, None) is not None:
            continue
        if not _is_data_folder(entry, None):
            return False
    return True


def _unlink_marker(out: Path) -> None:
    """Remove the staging marker from ``out``, a staging folder renamed into place (only
    this tool's marker naming one of ``out``'s staging folders)."""
    marker = out / STAGING_MARKER
    if (our_file_name(marker) or "").startswith(_staging_prefix(out)):
        marker.unlink(missing_ok=True)


def _is_draft(entry: Path) -> bool:
    """A metadata draft or a link draft an interrupted build left, recognised by its
    name and its content: a metadata file this tool writes, or a link to a data-folder
    name."""
    try:
        if _META_DRAFT.fullmatch(entry.name):
            if entry.is_symlink() or not entry.is_file() or entry.stat().st_size > 1 << 16:
                return False
            return is_index_meta(json.loads(entry.read_text(encoding="utf-8")))
        if _LINK_DRAFT.fullmatch(entry.name) and entry.is_symlink():
            return bool(_DATA_NAME.fullmatch(os.readlink(entry)))
    except (OSError, ValueError, RecursionError):
        return False
    return False


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def _clean_replaced(out: Path, *, keep: str, index_id: str, replaced: set[str]) -> None:
    """After the switch: remove the data folder(s) the index used before it
    (``replaced``) and what interrupted builds left (`_removable`: partial data
    folders, ones a draft names, the drafts). A complete data folder of this index that
    nothing names (a copy put back, a rollback) is kept, as is an edited one, with a
    warning. Files at the top level are never removed: a format-1 index's storage
    files there are indistinguishable from a user's, so they stay (harmless; the
    metadata no longer names them)."""
    named = replaced | _draft_names(out)
    for entry in out.iterdir():
        name = entry.name
        if name in (keep, META_FILE):
            continue
        if _removable(entry, index_id, named) or _is_draft(entry):
            _remove(entry)
        elif name == STAGING_MARKER:  # a build killed just after renaming its folder in
            _unlink_marker(out)
        elif _marked(entry, index_id):
            why = why_not_unedited(entry) or (
                "a complete data folder of this index that this build did not replace "
                "(a copy put back?)"
            )
            logger.warning(
                "kept %s: %s; the index no longer uses it: remove it when not needed (rm -r %s)",
                entry,
                why,
                shlex.quote(str(entry)),
            )


def _removable(entry: Path, index_id: str | None, named: set[str]) -> bool:
    """Whether the data folder ``entry`` (not in use) is one a build may delete: one of
    this index's, exactly as a build left it (`_is_data_folder`), and either still
    marked ``being written`` (never in use) or one of ``named`` (what the index used
    before this build, or what a draft of a killed build names)."""
    match = _marker_of(entry) if index_id is not None else None
    if match is None or not (match.group(4) or entry.name in named):
        return False  # decided before `_is_data_folder` reads (hashes) the files
    return _is_data_folder(entry, index_id)


def _draft_names(out: Path) -> set[str]:
    """The data folders the drafts in ``out`` name (what builds killed before their
    switch were about to switch to)."""
    return {name for name, _ in _drafted(out)}


def _drafted(out: Path) -> set[tuple[str, str | None]]:
    """``(data folder, index id)`` for each draft in ``out``: what a metadata draft
    names, with its index id; what a link draft points at (no id)."""
    found: set[tuple[str, str | None]] = set()
    for entry in out.iterdir():
        if not _is_draft(entry):
            continue
        if entry.is_symlink():
            found.add((os.readlink(entry), None))
            continue
        try:
            meta = json.loads(entry.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found.add((str(meta.get("data")), index_id_of(meta)))
    return found


def _clean_stale_builds(out: Path) -> None:
    """Remove what interrupted builds of ``out`` left: this tool's staging folders
    beside it (``.<out>.build-*``, see `_is_our_staging`), and inside it the drafts and
    marked data folders that neither its metadata nor ``current`` names."""
    if out.parent.is_dir():
        prefix = _staging_prefix(out)
        for entry in out.parent.iterdir():
            if entry.name.startswith(prefix) and _is_our_staging(entry):
                shutil.rmtree(entry, ignore_errors=True)
    meta = our_meta(out) if out.is_dir() else None
    if meta is None:  # not (or no longer) an index this tool wrote: touch nothing but
        for entry in killed_first_build(out) if out.is_dir() else []:  # a first build's
            _remove(entry)
        return
    index_id = index_id_of(meta)  # None for an index built before ids: data folders stay
    in_use = (str(meta.get("data") or ""), _linked_data(out, index_id))
    named = _draft_names(out)
    for entry in out.iterdir():
        if entry.name in in_use:
            continue
        if _removable(entry, index_id, named) or _is_draft(entry):
            _remove(entry)


def read_meta(path: Path) -> dict[str, Any]:
    """The metadata of the index at ``path`` (a `ValueError` naming the file if it is
    missing or unreadable)."""
    meta_path = path / META_FILE
    if not path.exists():
        raise ValueError(
            f"index {path} does not exist; build one with `hyde-plus index DIR --out {path}`"
        )
    if not meta_path.is_file():
        hint = " (a Milvus Lite database? open it with --uri)" if path.suffix == ".db" else ""
        raise ValueError(
            f"{path} is not a hyde-plus index (no {META_FILE}){hint}; build one with "
            "`hyde-plus index DIR --out PATH`"
        )
    unreadable = (
        f"; if it is an index hyde-plus built, delete the folder and rebuild it "
        f"(`hyde-plus index DIR --out {path}`): hyde-plus will not replace a folder "
        "it cannot recognise"
    )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{meta_path} is corrupt ({exc}){unreadable}") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path} is corrupt (not a JSON object){unreadable}")
    return dict(meta)


def rebuild_hint(path: Path) -> str:
    """The advice an error about a damaged or unreadable index at ``path`` ends with.

    Args:
        path: the index folder.
    """
    return f"rebuild it with `hyde-plus index DIR --out {path}`"


def data_folder(path: Path, meta: dict[str, Any]) -> Path:
    """The data folder ``meta`` names inside the index at ``path`` (``path`` itself for
    a format-1 index, which names none). Only a plain child name is followed: ``..``,
    a path with a separator, an absolute path, or a link leading out of the index is a
    `ValueError` (the index is damaged or was tampered with)."""
    name: object = meta.get("data")
    if name is None:
        return path
    plain = (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\x00")
        and Path(name).name == name
    )
    if plain and isinstance(name, str):
        data = path / name
        if not data.is_symlink() or data.resolve().parent == path.resolve():
            return data
    raise ValueError(
        f"{path / META_FILE}: 'data' must name a folder inside the index, not {name!r:.80}; "
        f"{rebuild_hint(path)}"
    )
