"""``trainer.safefile``: the trainer's writes follow no link and go only where no one
else can write (real files and links under ``tmp_path``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetero.trainer import safefile
from hetero.trainer.safefile import UnsafePathError


def test_a_whole_file_replaces_a_planted_link_and_leaves_its_target(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.write_text("canary")
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").symlink_to(canary)
    safefile.write_text(out / "run.json", "{}\n")
    assert canary.read_text() == "canary"
    assert not (out / "run.json").is_symlink() and (out / "run.json").read_text() == "{}\n"
    assert sorted(p.name for p in out.iterdir()) == ["run.json"], "a temporary file was left"


def test_an_appended_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.write_text("canary")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "rank0.jsonl").symlink_to(canary)
    with pytest.raises(UnsafePathError, match=r"rank0\.jsonl is a symbolic link"):
        safefile.open_file(tmp_path / "metrics" / "rank0.jsonl")
    assert canary.read_text() == "canary"


def test_a_planted_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "rank1.out")
    with pytest.raises(UnsafePathError, match=r"rank1\.out"):
        safefile.open_file(tmp_path / "rank1.out", append=False)


def test_a_world_writable_directory_is_refused_and_left_empty(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        safefile.write_text(shared / "summary.json", "{}")
    assert not list(shared.iterdir())


def test_created_directories_and_files_are_private_to_group_at_most(tmp_path: Path) -> None:
    path = safefile.write_text(tmp_path / "a" / "b" / "last.json", "{}")
    assert path.stat().st_mode & 0o777 == 0o640 & ~_umask()
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o750 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
