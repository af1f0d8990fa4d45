"""Sequential read speed of the disk under a data directory, in bytes per second.

A job that reads its data from a slow disk is input-bound whatever its devices'
speed, so the profile carries this figure beside the compute scores. The probe
writes a temporary file of ``size`` bytes in the directory, flushes it to the
disk, and times one sequential read of it in 1 MiB blocks. What the read came
from is said, not assumed (``DiskRead.method``):

- ``"o_direct"``: opened with ``O_DIRECT``, so the read bypasses the page cache
  and the figure is the device's (on tmpfs, which accepts the flag since Linux
  6.6, it is memory's). Filesystems that refuse ``O_DIRECT`` (older tmpfs, some
  network and overlay filesystems) fall to the next.
- ``"fadvise"``: the file's pages were dropped with ``posix_fadvise(DONTNEED)``
  after ``fsync`` and read back. The advice is honoured for clean pages on local
  disks; on a RAM-backed filesystem there is nothing to drop and the figure is
  memory speed.
- ``"cached"``: neither is available (not Linux): a page-cache read, an upper
  bound on the disk's speed.

The temporary file is removed in every case. A directory that cannot be written
gives no figure (``None``): the agent does not guess.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: Bytes the probe writes and reads: enough blocks for a steady rate, and well
#: under a second to read on any disk a job would train from.
PROBE_BYTES = 32 * 1024 * 1024

#: Read size: a multiple of every logical block size ``O_DIRECT`` may demand.
BLOCK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class DiskRead:
    """One sequential read: ``bytes_per_s`` from a read of ``size`` bytes by ``method``."""

    bytes_per_s: float
    method: str  # "o_direct", "fadvise" or "cached" (see the module's docstring)
    size: int


def measure_disk_read(directory: Path, size: int = PROBE_BYTES) -> DiskRead | None:
    """Time a sequential read of a fresh ``size``-byte file in ``directory``.

    ``None`` when the directory cannot hold the file (missing, read-only, full)."""
    size = max(BLOCK_BYTES, size - size % BLOCK_BYTES)
    try:
        fd, name = tempfile.mkstemp(prefix=".hetero-diskprobe-", dir=directory)
    except OSError:
        return None
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            block = os.urandom(BLOCK_BYTES)  # incompressible: no filesystem shortcut
            for _ in range(size // BLOCK_BYTES):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        return _read_direct(path, size) or _read_uncached(path, size)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def _read_direct(path: Path, size: int) -> DiskRead | None:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError:  # EINVAL: this filesystem refuses O_DIRECT
        return None
    # An anonymous mapping is page-aligned, as O_DIRECT requires of the buffer.
    buf = mmap.mmap(-1, BLOCK_BYTES)
    try:
        seconds = _timed_read(fd, buf, size)
    except OSError:  # a filesystem that accepts the flag but not the read
        return None
    finally:
        os.close(fd)
        buf.close()
    return DiskRead(size / seconds, "o_direct", size)


def _read_uncached(path: Path, size: int) -> DiskRead:
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(BLOCK_BYTES)
    try:
        advise = getattr(os, "posix_fadvise", None)
        if advise is not None:
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        seconds = _timed_read(fd, memoryview(buf), size)
    finally:
        os.close(fd)
    return DiskRead(size / seconds, "fadvise" if advise is not None else "cached", size)


def _timed_read(fd: int, buf: mmap.mmap | memoryview, size: int) -> float:
    done = 0
    t0 = time.perf_counter()
    while done < size:
        n = os.readv(fd, [buf])
        if n == 0:
            break
        done += n
    return max(time.perf_counter() - t0, 1e-9)
