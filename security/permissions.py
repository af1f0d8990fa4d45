"""What a hetero daemon does about users and file modes, whatever started it.

A shell, ``make demo``, a container or a unit file may start a daemon with any
umask; systemd's ``UMask=0027`` helps only under systemd. So both daemons set
:data:`DAEMON_UMASK` themselves first thing: the state directory, database,
token, rank logs and checkpoints they create are then readable by their own user
(and group, for directories) and by nobody else. A state directory that already
exists with permissions for others is tightened when this user owns it.

The agent runs every rank as its own user, so an agent running as root would run
every job's ``command:`` as root: it refuses unless told ``--allow-root``, or given
a ``rank_user`` (:func:`rank_user`): an unprivileged account every rank runs as,
which reads none of the agent's files.

A rank of the agent's own user could still read the agent's secrets through
``/proc/<agent>/environ`` (``$HETERO_TOKEN`` in a container) and
``/proc/<agent>/mem``: the kernel lets a process of the same uid read those of a
*dumpable* process. Once it has read its credentials the agent makes itself
undumpable (:func:`seal_secrets`): those files then belong to root and ptrace is
refused to the same uid. The token files themselves stay readable by the agent's
user, so by its ranks: only a rank under another uid is kept from them (docs/deploy.md).
"""

from __future__ import annotations

import ctypes
import logging
import os
import pwd
import stat
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from hetero.core.errors import ConfigError

log = logging.getLogger("hetero.security.permissions")

#: Files 0640 and directories 0750 at most: no access for other users.
DAEMON_UMASK = 0o027


def set_daemon_umask() -> None:
    """Apply :data:`DAEMON_UMASK` to this process and every process it starts."""
    os.umask(DAEMON_UMASK)


def private_dir(path: Path, *, passable: bool = False) -> Path:
    """``path`` created if missing (0750 under the daemon umask); if it exists with
    access for others and belongs to this user, that access is removed (logged).
    ``passable``: others may pass through it (x), as ranks under a ``rank_user`` do on
    the way to their working directories, but neither list nor write it."""
    kept = stat.S_IXOTH if passable else 0
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o750)
        info = path.stat()
        if info.st_mode & stat.S_IRWXO & ~kept and info.st_uid == os.geteuid():
            mode = stat.S_IMODE(info.st_mode) & ~stat.S_IRWXO | kept
            path.chmod(mode)
            log.warning("state directory %s was open to other users; now %o", path, mode)
    except OSError as exc:
        raise ConfigError(f"cannot create state directory {path}: {exc.strerror}") from None
    return path


def refuse_root(allow_root: bool, euid: int | None = None, *, rank_user: bool = False) -> None:
    """Raise unless this process is not root, or its ranks run as a ``rank_user``, or
    ``allow_root`` says running ranks as root is intended (``euid`` for tests; default
    this process's)."""
    if (os.geteuid() if euid is None else euid) == 0 and not (allow_root or rank_user):
        raise ConfigError(
            "refusing to run ranks as root: every job's command would run as root; run the "
            "agent as a service user, or as root with --rank-user NAME (docs/deploy.md), "
            "or pass --allow-root"
        )


@dataclass(frozen=True)
class RankUser:
    """The unprivileged account an agent started as root runs every rank as: the rank
    gets its uid, primary group and supplementary groups (``video``/``render`` for the
    GPUs where the driver asks for them), its home directory as ``HOME`` where it has one."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def rank_user(name: str, euid: int | None = None) -> RankUser:
    """The account ``name`` as a :class:`RankUser`. Raises ``ConfigError`` for an unknown
    user, for root, and where this process (``euid``) is not root: only root can start a
    process as another user without handing it capabilities of its own (a non-root
    agent's ambient capabilities would outlive the switch)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"rank_user: no user {name!r} on this host") from None
    if entry.pw_uid == 0:
        raise ConfigError(
            f"rank_user: {name} is root; name an unprivileged account "
            "(useradd --system --shell /usr/sbin/nologin hetero-rank)"
        )
    me = os.geteuid() if euid is None else euid
    if me != 0:
        raise ConfigError(
            f"rank_user: {name}: starting ranks as another user needs an agent running as "
            f"root (this one runs as uid {me})"
        )
    groups = tuple(os.getgrouplist(name, entry.pw_gid))
    return RankUser(name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


#: ``prctl`` option that sets whether this process can be dumped or traced (linux/prctl.h).
PR_SET_DUMPABLE = 4


def seal_secrets(names: tuple[str, ...], environ: MutableMapping[str, str] | None = None) -> bool:
    """After the credentials are read: make this process undumpable, so that another
    process of the same uid (a rank) cannot read its ``/proc/<pid>/environ`` or
    ``/proc/<pid>/mem`` nor trace it, and remove the variables ``names`` from
    ``environ`` (default ``os.environ``), so no child inherits them by accident.

    Removing a variable does not change ``/proc/<pid>/environ``, which shows the
    environment the process was started with: the undumpable flag is what guards it.
    Returns whether the flag is set (False where there is no ``prctl``: not Linux)."""
    env = os.environ if environ is None else environ
    for name in names:
        env.pop(name, None)
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("cannot make this process undumpable: %s", os.strerror(ctypes.get_errno()))
        return False
    return True
