"""Writing a job's files where another local user may have planted a link.

A job's output and checkpoint directories are named by its spec and may lie under
a shared root (``/shared/checkpoints``). If another user can write there, a file
name we are about to open may already be a symlink to something of ours (the
coordinator's database): ``open(path, "w")`` and ``torch.save(path)`` follow it
and overwrite the target with the job's user's rights. The kernel's
``protected_symlinks`` covers only sticky world-writable directories.

Two rules, applied to every file the trainer writes (checkpoints, metrics, the run
summary, rank logs):

- **A directory we write into is ours alone.** It is opened with ``O_NOFOLLOW``
  (the last component is no link) and checked with ``fstat`` on that descriptor:
  owned by this process's user and writable by neither group nor others. Anything
  else is refused with one line (:class:`UnsafePathError`). Files are then opened
  *relative to that descriptor*, so swapping a directory on the path after the
  check changes nothing: we write into the directory we checked. Refusing, rather
  than creating a private subdirectory inside a directory others can write, is
  deliberate: in a non-sticky shared directory another user can rename our
  subdirectory away and put a link of theirs in its place, and every later path
  resolution would go there; the user is told to use a directory of their own.
  Directories hetero creates get mode 0750 (less whatever the umask removes).
- **A file is created, never followed.** Whole files are written to a fresh
  temporary name (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0640) and renamed over
  the target, so a planted ``last.pt.tmp`` is neither followed nor in the way.
  Files appended to or truncated (metrics lines, logs) are opened with
  ``O_NOFOLLOW`` and must be regular files of ours.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from hetero.core.errors import HeteroError

#: Mode of the directories hetero creates (the umask may remove more).
DIR_MODE = 0o750
#: Mode of the files hetero creates (the umask may remove more).
FILE_MODE = 0o640

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafePathError(HeteroError):
    """A directory or file that another user could redirect: a link, not ours, or
    writable by group or others. The message says which and how to fix it."""

    grpc_code = "FAILED_PRECONDITION"
    exit_code = 2


def _refusal(path: Path, why: str) -> UnsafePathError:
    return UnsafePathError(
        f"refusing to write in {path}: {why}; give the job a directory of its own "
        f"(owned by uid {os.geteuid()}, not writable by group or others)"
    )


@contextlib.contextmanager
def open_dir(path: str | Path, *, create: bool = True) -> Iterator[int]:
    """A descriptor of directory ``path``, checked to be safe to write into (module doc),
    closed on exit. ``create``: make it (and its parents) if missing, mode ``DIR_MODE``."""
    path = Path(path)
    if create:
        try:
            path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except FileExistsError:
            pass  # a link or a file where the directory should be: refused below
        except OSError as exc:
            raise UnsafePathError(f"cannot create {path}: {exc.strerror or exc}") from None
    try:
        fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise _refusal(path, "it is a symbolic link") from None
        raise UnsafePathError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise _refusal(path, "it is not a directory")
        if st.st_uid != os.geteuid():
            raise _refusal(path, f"it belongs to uid {st.st_uid}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise _refusal(
                path, f"it is writable by group or others (mode {st.st_mode & 0o7777:o})"
            )
        yield fd
    finally:
        os.close(fd)


def ensure_dir(path: str | Path) -> Path:
    """Create ``path`` if missing and check it is safe to write into (module doc), for a
    directory that a library fills by path (sharded checkpoints, TensorBoard)."""
    with open_dir(path):
        return Path(path)


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], object]) -> Path:
    """Write ``path`` whole: ``write`` fills a fresh temporary file in the same checked
    directory, which then replaces ``path``. A reader sees the old file or the new one,
    never half; nothing planted under any name is followed. Returns ``path``."""
    path = Path(path)
    with open_dir(path.parent) as dir_fd:
        tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
            FILE_MODE,
            dir_fd=dir_fd,
        )
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    """:func:`write_atomic` of ``text`` as UTF-8."""
    return write_atomic(path, lambda fh: fh.write(text.encode("utf-8")))


def open_file(path: str | Path, *, append: bool = True) -> IO[bytes]:
    """``path`` opened for writing in binary, created (mode ``FILE_MODE``) if missing:
    appended to (``append``) or truncated. Its directory is checked (module doc) and the
    file must be a regular file of ours, reached without following a link."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK
    flags |= os.O_APPEND if append else 0
    with open_dir(path.parent) as dir_fd:
        try:
            fd = os.open(path.name, flags, FILE_MODE, dir_fd=dir_fd)
        except OSError as exc:
            if os.path.islink(path):
                raise _refusal(path.parent, f"{path.name} is a symbolic link") from None
            raise UnsafePathError(f"cannot open {path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise _refusal(path.parent, f"{path.name} is not a regular file of ours")
    os.set_blocking(fd, True)  # O_NONBLOCK only so that a planted FIFO cannot hang open()
    if not append:
        os.ftruncate(fd, 0)
    return os.fdopen(fd, "ab" if append else "wb")
