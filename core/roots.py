"""Allowed roots: the directories a job's ``checkpoint.dir`` and ``data_dir`` may name.

A job's paths are opened on the agents' nodes by its ranks, which run as the
agent's user. Without a check, one job could point its checkpoints at
``/etc/hetero`` or another job's directory, and read "data" from anywhere the
agent can read. The coordinator checks each path at submit time:

- it must be absolute (ranks start in different working directories, so a
  relative path means a different place on every rank);
- after lexical normalisation (``a/../b`` is ``b``) it must lie under one of the
  coordinator's ``allowed_roots``;
- it must not hold a daemon's private files (:func:`path_problem`'s ``private``:
  the coordinator's state directory, database and secrets): a job whose directory
  is ``/`` or ``/var/lib`` could read the secrets or write over the database.

Default root: ``job-files`` in the coordinator's state directory. Neither the
state directory itself (its database and secrets), nor the home directory of the
user the coordinator runs as (which holds the default state directory,
``~/.local/state/hetero``), nor the temp directory: ``/tmp`` is writable by every
local user, who could plant or read another job's checkpoints there. A deployment
lists its shared storage in ``allowed_roots`` (``[/shared/checkpoints, /data]``), and
a list replaces the default. No root may hold a daemon's state directory
(:func:`check_private`): the coordinator refuses to start with one, and so does an
agent whose state directory lies in one of its coordinator's roots.

The check is lexical: the coordinator cannot see the agents' file systems, so a
symlink inside a root is followed there. It guards against mistakes and against
jobs writing outside their area; it is not a sandbox for a job's own ``command:``,
which runs as the agent's user anyway.

Pure: no grpc, sqlalchemy or torch; job.yaml's parser (``hetero.core.jobspec``) uses it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path

from hetero.core.errors import ConfigError

#: Longest path accepted, in bytes (Linux PATH_MAX).
MAX_PATH_BYTES = 4096


#: The default allowed root's name in the coordinator's state directory.
JOB_FILES = "job-files"


def default_roots(state_dir: Path) -> tuple[str, ...]:
    """``job-files`` in the coordinator's state directory: not the state directory
    itself (its database and secrets), not the home directory that holds it, never
    ``/tmp`` (which every local user can write)."""
    return (normalize_root(str(state_dir / JOB_FILES)),)


def normalize_root(root: str) -> str:
    return posixpath.normpath(str(Path(root).expanduser()))


def normalize(path: str) -> str:
    """``path`` normalised lexically (``a/../b`` is ``b``; POSIX's leading ``//`` is ``/``)."""
    path = posixpath.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path


def inside(path: str, root: str) -> bool:
    """Whether normalised ``path`` is ``root`` or lies under it (lexically)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def overlap(a: str, b: str) -> bool:
    """Whether one of two normalised directories is, or holds, the other."""
    return inside(a, b) or inside(b, a)


def absolute(path: Path) -> str:
    """``path`` (``~`` expanded, relative to the working directory) normalised."""
    return normalize(str(path.expanduser().absolute()))


def check_private(private: Sequence[tuple[str, str]], roots: Sequence[str]) -> None:
    """A ``ConfigError`` if one of a daemon's ``private`` files or directories (what it
    is, its :func:`absolute` path) lies in an allowed root: a job could read or write
    over it there."""
    for what, path in private:
        for root in roots:
            if inside(path, root):
                raise ConfigError(
                    f"{what} {path} lies inside the allowed root {root}, where jobs write: "
                    "list allowed_roots that do not hold it, or move it out"
                )


def path_problem(
    value: str, roots: Sequence[str] | None, private: Sequence[str] = ()
) -> str | None:
    """Why ``value`` is not an acceptable job path under ``roots``, or None if it is.

    ``roots`` None skips the roots check (parsing a stored spec, or a client's
    local pre-check that does not know the coordinator's setting). ``private``: the
    coordinator's own files and directories, which no job path may hold."""
    if "\x00" in value:
        return "must not contain a NUL character"
    if len(value.encode("utf-8", errors="replace")) > MAX_PATH_BYTES:
        return f"is longer than {MAX_PATH_BYTES} bytes"
    if not value.startswith("/"):
        return f"must be an absolute path (ranks start in different directories), got {value!r}"
    path = normalize(value)
    for held in private:
        if inside(held, path):
            return f"{path} holds the coordinator's own files ({held}): no job path may"
    if roots is None or any(inside(path, root) for root in roots):
        return None
    return (
        f"{path} is outside the coordinator's allowed roots ({', '.join(roots)}); "
        "an operator can add a root with allowed_roots in coordinator.yaml"
    )
