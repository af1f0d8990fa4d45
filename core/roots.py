"""Allowed roots: the directories a job's ``checkpoint.dir`` and ``data_dir`` may name.

A job's paths are opened on the agents' nodes by its ranks, which run as the
agent's user. Without a check, one job could point its checkpoints at
``/etc/hetero`` or another job's directory, and read "data" from anywhere the
agent can read. The coordinator checks each path at submit time:

- it must be absolute (ranks start in different working directories, so a
  relative path means a different place on every rank);
- after lexical normalisation (``a/../b`` is ``b``) it must lie under one of the
  coordinator's ``allowed_roots``.

Default roots: the coordinator's state directory and the home directory of
the user it runs as. Not the temp directory: ``/tmp`` is writable by every
local user, who could plant or read another job's checkpoints there. A
deployment lists its shared storage in ``allowed_roots``
(``[/shared/checkpoints, /data]``), and a list replaces the defaults. The check is lexical: the coordinator cannot see
the agents' file systems, so a symlink inside a root is followed there. It
guards against mistakes and against jobs writing outside their area; it is not
a sandbox for a job's own ``command:``, which runs as the agent's user anyway.

Pure: no grpc, sqlalchemy or torch; job.yaml's parser (``hetero.core.jobspec``) uses it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path

#: Longest path accepted, in bytes (Linux PATH_MAX).
MAX_PATH_BYTES = 4096


def default_roots(state_dir: Path) -> tuple[str, ...]:
    """The coordinator's state directory and its user's home (never ``/tmp``, which
    every local user can write)."""
    roots = [str(state_dir), str(Path.home())]
    return tuple(dict.fromkeys(normalize_root(r) for r in roots))


def normalize_root(root: str) -> str:
    return posixpath.normpath(str(Path(root).expanduser()))


def path_problem(value: str, roots: Sequence[str] | None) -> str | None:
    """Why ``value`` is not an acceptable job path under ``roots``, or None if it is.

    ``roots`` None skips the roots check (parsing a stored spec, or a client's
    local pre-check that does not know the coordinator's setting)."""
    if "\x00" in value:
        return "must not contain a NUL character"
    if len(value.encode("utf-8", errors="replace")) > MAX_PATH_BYTES:
        return f"is longer than {MAX_PATH_BYTES} bytes"
    if not value.startswith("/"):
        return f"must be an absolute path (ranks start in different directories), got {value!r}"
    if roots is None:
        return None
    path = posixpath.normpath(value)
    if path.startswith("//"):  # POSIX keeps a leading '//'; it is the same root
        path = "/" + path.lstrip("/")
    for root in roots:
        if root == "/" or path == root or path.startswith(root.rstrip("/") + "/"):
            return None
    return (
        f"{path} is outside the coordinator's allowed roots ({', '.join(roots)}); "
        "an operator can add a root with allowed_roots in coordinator.yaml"
    )
