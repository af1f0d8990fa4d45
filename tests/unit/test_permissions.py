"""The daemons' user and file-mode rules (``hetero.security.permissions``), without root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hetero.core.errors import ConfigError
from hetero.security.permissions import DAEMON_UMASK, private_dir, refuse_root


def test_root_is_refused_unless_allowed_and_other_users_pass() -> None:
    with pytest.raises(ConfigError, match="refusing to run ranks as root"):
        refuse_root(False, euid=0)
    refuse_root(True, euid=0)
    refuse_root(False, euid=1000)


def test_private_dir_creates_and_tightens_this_users_directory(tmp_path: Path) -> None:
    old = os.umask(DAEMON_UMASK)
    try:
        fresh = private_dir(tmp_path / "a" / "state")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o750
        open_dir = tmp_path / "open"
        open_dir.mkdir(mode=0o777)
        open_dir.chmod(0o757)
        private_dir(open_dir)
        assert stat.S_IMODE(open_dir.stat().st_mode) == 0o750
    finally:
        os.umask(old)


def test_private_dir_names_the_directory_it_cannot_create(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=f"cannot create state directory {blocker}/x"):
        private_dir(blocker / "x")
