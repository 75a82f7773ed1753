"""Small helpers for files: a streamed sha256, JSON lines, folders and files written
beside their target (with the umask's permissions), and this tool's staging marker."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def sha256_file(path: Path) -> str:
    """The hex sha256 of ``path``, read in 1 MB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def json_lines(
    lines: Iterator[str] | list[str], where: str, error: type[ValueError] = ValueError
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line; ``error`` names
    ``where:line`` for a line that is not a JSON object."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise error(f"{where}:{lineno}: not valid JSON ({exc})") from exc
        except RecursionError:
            raise error(f"{where}:{lineno}: JSON nested too deeply to read") from None
        if not isinstance(row, dict):
            raise error(f"{where}:{lineno}: expected a JSON object")
        yield lineno, row


#: The file inside every staging folder this tool makes beside an index: a folder is
#: cleaned up as an interrupted build only when it holds this file naming the folder.
STAGING_MARKER = ".hyde-plus-staging"
_OUR_TEXT = "written by hyde-plus for {name}; safe to delete with it\n"
_OUR_PATTERN = re.compile(r"written by hyde-plus for ([^/\n]+); safe to delete with it\n")
"""A folder name may hold ``;`` or ``\\`` (not ``/``); the last ``; safe...`` ends it."""


def write_our_file(path: Path, name: str, *, replace: bool = False) -> None:
    """Write the marker file ``path`` saying this tool made ``name`` (a folder's name);
    with ``replace``, over an existing marker atomically (`write_text_atomic`)."""
    if replace:
        write_text_atomic(path, _OUR_TEXT.format(name=name))
        return
    path.write_text(_OUR_TEXT.format(name=name), encoding="utf-8")


def our_file_name(path: Path) -> str | None:
    """The name a marker file written by `write_our_file` records, or None when
    ``path`` is not such a file (absent, a link, a folder, other text)."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 512:
            return None
        match = _OUR_PATTERN.fullmatch(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    return match.group(1) if match else None


def is_our_file(path: Path, name: str) -> bool:
    """Whether ``path`` is this tool's marker file for ``name``."""
    return our_file_name(path) == name


def make_folder_beside(parent: Path, prefix: str, *, marked: bool = False) -> Path:
    """A new, empty folder ``parent/<prefix><random>`` with the permissions the umask
    gives (not `tempfile.mkdtemp`'s 0700), holding `STAGING_MARKER` naming it when
    ``marked``."""
    for _ in range(100):
        path = parent / f"{prefix}{secrets.token_hex(6)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        if marked:
            write_our_file(path / STAGING_MARKER, path.name)
        return path
    raise FileExistsError(f"could not make a new folder in {parent}")


def is_marked_staging(path: Path) -> bool:
    """Whether ``path`` is a real folder (not a link) holding this tool's staging
    marker naming it (a marker copied into another folder does not count)."""
    try:
        if path.is_symlink() or not path.is_dir():
            return False
    except OSError:
        return False
    return is_our_file(path / STAGING_MARKER, path.name)


@contextmanager
def locked_folder(folder: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``folder`` itself while the block runs (no
    lock file is made, nothing is left behind; a killed holder releases it);
    ``on_wait`` is called once if another holder makes it wait. Where `fcntl` is
    missing (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder we may write but not list: run unlocked, as before
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


#: The first line of every Markdown file this tool writes (invisible when rendered),
#: with the sha256 of the rest: an existing Markdown output is overwritten only when it
#: starts so and the rest is unchanged (not edited by hand since).
_MARKDOWN_SEAL = "<!-- written by hyde-plus {by} (sha256 {digest}); edit it and it is yours -->\n"
_MARKDOWN_SEAL_RE = re.compile(
    rb"<!-- written by hyde-plus ([a-z]+) \(sha256 ([0-9a-f]{64})\); edit it and it is yours -->\n"
)
#: The key every JSON output this tool writes ends with: the sha256 of the rest.
SEAL_KEY = "hyde_plus_sha256"


def check_replaceable(path: Path, what: str, kind: str, ours: Callable[[bytes], bool]) -> None:
    """A `ValueError` naming ``what`` unless ``path`` is absent or a regular file this
    tool wrote (``ours`` of its first 16 MB says so: what this tool writes is
    smaller), so an output never overwrites someone's file (or follows a link to one)."""
    if not (path.exists() or path.is_symlink()):
        return
    refusal = (
        f"{what} {path} exists and is not {kind} hyde-plus wrote; refusing to overwrite "
        "it: choose another path (or remove the file yourself)"
    )
    if path.is_symlink() or not path.is_file():
        raise ValueError(refusal)
    try:
        with path.open("rb") as handle:
            head = handle.read(1 << 24)
    except OSError as exc:
        raise ValueError(f"{what} {path} cannot be read ({exc.strerror})") from exc
    if not ours(head):
        raise ValueError(refusal)


def check_creatable(path: Path, what: str) -> None:
    """A `ValueError` ("``what``: cannot write in ...") unless the nearest existing
    folder at or above ``path`` is writable: missing folders are made only when
    something is written, so a run refused later leaves none behind."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{what}: cannot write in {existing}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sealed_markdown(text: str, by: str) -> str:
    """``text`` under a first-line comment recording the command that wrote it (``by``:
    ``eval``, ``tune``) and its sha256 (see `is_our_markdown`)."""
    return _MARKDOWN_SEAL.format(by=by, digest=_sha256(text.encode("utf-8"))) + text


def is_our_markdown(head: bytes, by: str) -> bool:
    """Whether ``head`` (a whole file) is Markdown `sealed_markdown` wrote for the
    command ``by``, unedited (one command never overwrites another's report)."""
    match = _MARKDOWN_SEAL_RE.match(head)
    if match is None or match.group(1).decode() != by:
        return False
    return match.group(2).decode() == _sha256(head[match.end() :])


def sealed_json(payload: dict[str, Any]) -> str:
    """``payload`` as indented JSON ending with `SEAL_KEY`: the sha256 of the rest."""
    body = json.dumps(payload, indent=2)
    return json.dumps({**payload, SEAL_KEY: _sha256(body.encode("utf-8"))}, indent=2) + "\n"


def is_sealed_json(head: bytes, *keys: str) -> bool:
    """Whether ``head`` (a whole file) is JSON `sealed_json` wrote, unedited (byte for
    byte: even a file re-indented with the same content is the user's now), holding
    every one of ``keys``."""
    try:
        data = json.loads(head.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    if not isinstance(data, dict) or not all(k in data for k in keys):
        return False
    digest = data.pop(SEAL_KEY, None)
    if digest != _sha256(json.dumps(data, indent=2).encode("utf-8")):
        return False
    return head == sealed_json(data).encode("utf-8")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` as `write_bytes_atomic` does."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it renamed into place,
    so a reader sees the old file or the new one (a kill mid-write leaves the old
    one whole, and a hard link to the old file keeps its content); the file gets the
    permissions the umask gives (not `tempfile.mkstemp`'s 0600)."""
    write_all_atomic([(path, data)])


def write_all_atomic(files: list[tuple[Path, bytes]]) -> None:
    """Write every ``(path, data)`` through a temporary file beside it, and rename them
    into place only once all are written: a full disk (or an error) while writing
    leaves every old file as it was and no temporary file behind; only a kill between
    the renames (which need no space) can leave some replaced. Files get the
    permissions the umask gives."""
    pending: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            pending.append((tmp, path))
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        for tmp, path in pending:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in pending:
            tmp.unlink(missing_ok=True)  # those renamed already are gone: no-op
        raise


def read_regular_bytes(path: Path) -> bytes:
    """The bytes of the regular file ``path`` (a link to one is followed); a
    `ValueError` for anything else. Opened non-blocking and checked on the open file,
    so a FIFO put in its place never blocks the read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular file")
        return handle.read()


def not_regular_reason(path: Path) -> str | None:
    """Why ``path`` is not a file to read: None for a regular file (or a link to one),
    ``""`` for a folder, else the reason in words (a link to nothing, a link loop, a
    FIFO, a socket, a device), so a caller can list it rather than drop it silently."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "a symbolic link to nothing (dangling)" if path.is_symlink() else "vanished"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop"
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return ""
    kind = (
        "a named pipe (FIFO)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
    )
    return f"{kind}, not a regular file; not read"
