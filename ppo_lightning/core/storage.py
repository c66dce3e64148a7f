"""Faults of the machine's storage: a folder that cannot be written, a disk that fills.

- Before training (or an export) starts, every folder the run will write is probed by writing and
  removing a small file in it (`check_writable`): file permissions do not stop root, a read-only mount
  does, so the probe writes rather than asking ``os.access``. A folder that cannot be written is
  refused in one line (`UnwritablePath`, exit code 4).
- While the run writes, an out-of-space error (``ENOSPC``, ``EDQUOT``, SQLite's "database or disk is
  full"; anywhere in the exception's chain, since torch wraps the ``OSError`` in a ``RuntimeError``) is
  recognized by `out_of_space` and becomes `StorageFull` (exit code 5) where the run cannot go on
  without the write. `counted_bytes` measures what the write needed: the object is serialized again into
  a sink that only counts (on the failure path only).
- Every file the project replaces in place goes through `atomic_replace` (temporary file beside it,
  fsync, rename, fsync of the folder): a failed write leaves the previous file whole and no temporary.

May import: the standard library only.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from ppo_lightning.core.errors import UnwritablePath

SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
SPACE_TEXTS = ("No space left on device", "Disk quota exceeded", "database or disk is full")


def _chain(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def out_of_space(err: BaseException) -> bool:
    """True if ``err`` (or an exception it was raised from) says the disk or a quota is full."""
    for e in _chain(err):
        if isinstance(e, OSError) and e.errno in SPACE_ERRNOS:
            return True
        if any(t in str(e) for t in SPACE_TEXTS):
            return True
    return False


def space_error_text(err: BaseException) -> str:
    """``no space left on device`` / ``disk quota exceeded``: the words for the one-line message."""
    for e in _chain(err):
        if isinstance(e, OSError) and e.errno == errno.EDQUOT or "quota" in str(e).lower():
            return "disk quota exceeded"
    return "no space left on device"


def existing_ancestor(path: str | os.PathLike) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes free to this user on the file system of ``path`` (or of its nearest existing folder)."""
    try:
        return shutil.disk_usage(existing_ancestor(path)).free
    except OSError:
        return None


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def write(self, data) -> int:
        self.n += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def counted_bytes(write) -> int | None:
    """The bytes ``write(file_like)`` produces, counted without storing them (None if it fails)."""
    sink = _Counter()
    try:
        write(sink)
    except Exception:  # noqa: BLE001 - an estimate only
        return None
    return sink.n


def tree_bytes(path: str | os.PathLike) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def fsync_dir(folder: str | os.PathLike) -> None:
    """fsync a folder, so that a rename in it is durable (a no-op where the platform does not allow it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not supported on every platform / file system
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_replace(path: str | os.PathLike, write: Callable[[BinaryIO], object], tmp_suffix: str = ".tmp") -> None:
    """Replace ``path`` with what ``write(f)`` writes into a binary file, atomically: a temporary file
    in the same folder (``.<name>.*<tmp_suffix>``), flush, fsync, ``os.replace`` (atomic on POSIX),
    then fsync of the folder. On any failure the temporary file is removed and the error raised as it
    came (callers turn an out-of-space error into their own `StorageFull`)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=tmp_suffix, dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def user_cache_folder() -> Path:
    """This user's cache folder for the project (what is kept per machine: the precision probe's
    answers, an empty MLflow store): platformdirs' ``$XDG_CACHE_HOME/ppo-lightning`` or
    ``~/.cache/ppo-lightning`` on Linux; the XDG rule where platformdirs is not installed."""
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("ppo-lightning"))
    except ImportError:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ppo-lightning"


def check_writable(folder: str | os.PathLike, what: str, hint: str = "") -> Path:
    """Create ``folder`` if needed and write, fsync and remove a small file in it; raise
    `UnwritablePath` (one line: what, where, the system's reason, ``hint``) if any step fails."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".ppo-lightning-probe-", dir=folder)
        try:
            os.write(fd, b"probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise UnwritablePath(f"{what} {folder} cannot be written ({reason}); nothing was trained or written"
                             + (f"; {hint}" if hint else "")) from None
    return folder
