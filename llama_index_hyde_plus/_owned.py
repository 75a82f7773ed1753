"""The one pattern for everything hyde-plus writes to disk.

A folder hyde-plus owns (an index, eval results, a question set) carries one marker,
``.hyde-plus``, naming what it is, and is written only when new, empty or marked as
that kind; inside it hyde-plus replaces its own files and says so. Anything else in
the way is refused with an error naming the path and the option. Every file is
written beside its target and renamed over it (a kill leaves the old file whole);
builds in one folder, and the writers and readers of a question set, take its lock, so
they write one at a time and nothing is read half written.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER = ".hyde-plus"
"""The file naming what a folder hyde-plus owns is; its first line is ``hyde-plus <kind>``."""

_EXPLAINED = "This folder was written by hyde-plus, which replaces its own files in it.\n"


def marker_kind(folder: Path) -> str | None:
    """The kind the marker in ``folder`` names, or None (no marker, or not one of ours)."""
    path = folder / MARKER
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1024:
            return None
        first = path.read_text(encoding="utf-8").partition("\n")[0]
    except (OSError, UnicodeDecodeError):
        return None
    return first.removeprefix("hyde-plus ") if first.startswith("hyde-plus ") else None


def check_folder(folder: Path, kind: str, flag: str) -> Path:
    """``folder`` (``~`` expanded) if hyde-plus may write ``kind`` there (absent, empty
    or marked as ``kind``; creatable); else a `ValueError` naming ``flag`` and the path."""
    folder = Path(folder).expanduser()
    if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        what = "a file" if folder.exists() else "a link to nothing"
        raise ValueError(f"{flag} {folder} is {what}, not a folder; give a new or empty folder")
    if folder.is_dir() and any(folder.iterdir()) and (found := marker_kind(folder)) != kind:
        why = f"its {MARKER} marker says {found}" if found else f"no {MARKER} marker"
        raise ValueError(
            f"{flag} {folder} is neither empty nor a hyde-plus {kind} folder ({why}); "
            "it is left alone: choose a new or empty folder"
        )
    check_creatable(folder, flag)
    return folder


def claim(folder: Path, kind: str) -> bool:
    """Make ``folder`` (and its parents) if needed and mark it as ``kind`` (checked by
    `check_folder` first); whether it was unmarked before (new or empty)."""
    folder.mkdir(parents=True, exist_ok=True)
    if marker_kind(folder) == kind:
        return False
    write_all_atomic([(folder / MARKER, f"hyde-plus {kind}\n{_EXPLAINED}".encode())])
    return True


def check_outputs(paths: Sequence[Path], flag: str) -> list[Path]:
    """Those of ``paths`` (outputs in a folder hyde-plus owns) that exist and will be
    replaced; a `ValueError` naming ``flag`` for a folder, a link or a special file (a
    user's, in the way)."""
    for path in paths:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            what = (
                "a link" if path.is_symlink() else "a folder" if path.is_dir() else "a special file"
            )
            raise ValueError(
                f"{flag}: {path} is {what} hyde-plus did not write; it is left alone: "
                "move it away or choose another folder"
            )
    return [p for p in paths if p.exists()]


def say_replacing(paths: Sequence[Path]) -> None:
    """Warn (the CLI shows it) in one line which of its own files a run replaces."""
    if paths:
        names = ", ".join(p.name for p in paths)
        logger.warning("replacing %s in %s from the previous run", names, paths[0].parent)


def check_file(path: Path, flag: str, kind: str, ours: Callable[[bytes], bool]) -> Path:
    """``path`` (expanded) if a file may be written there outside a folder hyde-plus
    owns: absent, or a regular file whose first 64 KB ``ours`` recognises as ``kind``;
    its folder creatable. Else a `ValueError` naming ``flag`` and the path."""
    path = Path(path).expanduser()
    if path.exists() or path.is_symlink():
        try:
            regular = path.is_file() and not path.is_symlink()
            head = path.open("rb").read(1 << 16) if regular else b""
        except OSError as exc:
            raise ValueError(f"{flag} {path} cannot be read ({exc.strerror})") from exc
        if not ours(head):
            raise ValueError(
                f"{flag} {path} exists and is not {kind} hyde-plus wrote; it is left "
                "alone: choose another path (or remove the file yourself)"
            )
    check_creatable(path.parent, flag)
    return path


def check_creatable(path: Path, what: str) -> None:
    """A `ValueError` unless the nearest existing folder at or above ``path`` is
    writable: missing folders are made only when something is written."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{what}: cannot write in {existing}")


class FolderBusyError(ValueError):
    """Another hyde-plus process held a folder's lock for longer than `locked_folder`
    was asked to wait."""


_held = threading.local()
"""The folders whose lock this thread holds: (device, inode) -> shared or not."""


@contextmanager
def locked_folder(
    folder: Path, *, shared: bool = False, wait: float | None = None, what: str = "build"
) -> Iterator[None]:
    """Hold a lock on ``folder`` itself: exclusive (a writer), or ``shared`` with other
    readers; no lock file, and a killed holder releases it. Another holder makes it
    wait, with a warning naming ``what`` it waits for: without end, or ``wait``
    seconds and then a `FolderBusyError` naming the folder. A thread that holds the
    folder's lock already holds it again at once (an exclusive lock covers a shared
    one). Unlocked without `fcntl`."""
    try:
        import fcntl

        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):  # not POSIX, or a folder we may write but not list
        yield
        return
    try:
        status = os.fstat(fd)
        key = (status.st_dev, status.st_ino)
        held: dict[tuple[int, int], bool] = _held.__dict__.setdefault("folders", {})
        if key in held:
            if held[key] and not shared:
                raise RuntimeError(f"{folder}: a write lock asked for under a read lock")
            yield
            return
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning("waiting for another hyde-plus %s in %s to finish", what, folder)
            _wait_for(fd, mode, folder, wait)
        held[key] = shared
        try:
            yield
        finally:
            del held[key]
    finally:
        os.close(fd)  # closing releases the lock


def _wait_for(fd: int, mode: int, folder: Path, wait: float | None) -> None:
    """Take the lock ``mode`` on ``fd`` (of ``folder``) once its holder lets go,
    waiting as long as it takes (``wait`` None) or, polled, ``wait`` seconds at most."""
    import fcntl

    if wait is None:
        fcntl.flock(fd, mode)
        return
    deadline, pause = time.monotonic() + wait, 0.02
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FolderBusyError(
                    f"{folder} is in use by another hyde-plus run (waited {wait:g} s)"
                ) from None
            time.sleep(min(pause, left))
            pause = min(2 * pause, 0.5)


def write_all_atomic(files: Sequence[tuple[Path, bytes | str]]) -> None:
    """Write every ``(path, data)`` (text as UTF-8) to a temporary file beside it, then
    rename them all into place: an error or a kill while writing leaves every old file
    whole (only a kill between the renames can replace some); an error removes the
    temporary files, a kill (``SIGKILL``) may leave them, hidden (``.NAME.HEX.tmp``)
    and never read."""
    pending: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            pending.append((tmp, path))
            with os.fdopen(fd, "wb") as handle:
                handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        for tmp, path in pending:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in pending:
            tmp.unlink(missing_ok=True)  # those renamed already are gone: no-op
        raise
