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
  fsync, rename, fsync of the folder), or `atomic_path` where the writer takes a file name (a video
  encoder, SQLite): a failed write leaves the previous file whole and no temporary. Every folder
  written whole (a sharded checkpoint, a Hugging Face export) is written under a temporary name and
  swapped in by `replace_folder`.

May import: the standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

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


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, tmp_suffix: str = ".tmp", exclusive: bool = False) -> Iterator[Path]:
    """A temporary file name beside ``path`` (``.<name>.<random><tmp_suffix>``, created empty with the
    permissions a plain ``open`` gives: 0o666 less the umask) for a writer that takes a file name; when the block ends the file is fsynced and renamed to ``path``
    (``os.replace``, atomic on POSIX), then the folder fsynced. ``exclusive``: ``path`` is created
    only if it does not exist (a hard link; `FileExistsError` otherwise), never replaced. On any
    failure the temporary file is removed and the error raised as it came (callers turn an
    out-of-space error into their own `StorageFull`)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while tmp is None:
            name = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}{tmp_suffix}"
            try:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                tmp = name
            except FileExistsError:
                continue
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, path)
            tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_replace(path: str | os.PathLike, write: Callable[[BinaryIO], object], tmp_suffix: str = ".tmp") -> None:
    """Replace ``path`` with what ``write(f)`` writes into a binary file, atomically (`atomic_path`)."""
    with atomic_path(path, tmp_suffix) as tmp, open(tmp, "wb") as f:
        write(f)


def fsync_tree(folder: str | os.PathLike) -> None:
    """fsync every file under ``folder``, then the folder."""
    for p in Path(folder).rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(folder)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2``); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(a))


def replace_folder(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Make the complete folder ``tmp`` (written beside ``path``, its files fsynced: `fsync_tree`)
    ``path``. An existing folder is swapped out with one ``renameat2(RENAME_EXCHANGE)`` (Linux: both
    paths exist throughout) and removed; where the exchange is not supported it is moved aside, ``tmp``
    renamed in (the old folder moved back if that fails), and the old one removed. An existing file of
    that name is replaced."""
    tmp, path = Path(tmp), Path(path)
    if path.is_dir():
        if _exchange(tmp, path):
            shutil.rmtree(tmp)  # now the previous folder
        else:
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.rename(path, old / path.name)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(old / path.name, path)
                shutil.rmtree(old, ignore_errors=True)
                raise
            shutil.rmtree(old, ignore_errors=True)
    else:
        if path.exists():  # a single file of the same name
            path.unlink()
        os.rename(tmp, path)
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
