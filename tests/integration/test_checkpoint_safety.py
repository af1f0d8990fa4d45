"""Checkpoints cannot run code and belong to one run (the adversarial cases of checkpoint.dir).

A file planted in a job's ``checkpoint.dir`` that pickles a callable is refused
without running it; a second run that shares the directory does not silently
continue the first one's training."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from hetero.core.errors import CheckpointError
from hetero.trainer.checkpoint import FORMAT, read_checkpoint

TINY = ["--model", "debug", "--num-samples", "480", "--global-batch", "48", "--quiet"]
RUN = [*TINY, "--ideal-steps", "0", "--checkpoint-interval", "2"]


class _Planted:
    """What an attacker pickles: unpickling calls ``os.system`` (here: touch a marker)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _plant(path: Path, marker: Path, *, zip_format: bool) -> None:
    state = {"format": FORMAT, "job_id": None, "spec_hash": None, "payload": _Planted(marker)}
    path.parent.mkdir(parents=True, exist_ok=True)
    if zip_format:
        torch.save(state, path)
    else:  # a bare pickle, as an older torch.save or a hand-made file would be
        path.write_bytes(pickle.dumps(state))


@pytest.mark.parametrize("zip_format", [True, False], ids=["torch-save", "bare-pickle"])
def test_a_planted_pickle_is_refused_without_running(tmp_path: Path, zip_format: bool) -> None:
    marker, ckpt = tmp_path / "ran", tmp_path / "ckpt" / "last.pt"
    _plant(ckpt, marker, zip_format=zip_format)
    with pytest.raises(CheckpointError, match="could run code") as err:
        read_checkpoint(ckpt)
    assert "\n" not in str(err.value)
    assert not marker.exists(), "loading the checkpoint ran the planted code"


def test_resume_auto_refuses_a_planted_last_pt_with_one_line(hetero_train, tmp_path: Path) -> None:
    """The attack of issue 17 item 3: a ``last.pt`` planted where a restart resumes from."""
    out, marker = tmp_path / "run", tmp_path / "ran"
    _plant(out / "checkpoints" / "last.pt", marker, zip_format=True)
    proc = hetero_train(*RUN, "--steps", "4", "--output-dir", str(out), "--resume", "auto")
    assert proc.returncode != 0
    assert not marker.exists(), "resume ran the planted code"
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert "could run code" in errors[0]


def test_a_second_job_sharing_the_directory_does_not_resume_the_first(
    hetero_train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "shared"
    monkeypatch.setenv("HETERO_JOB_ID", "job-first")
    first = hetero_train(*RUN, "--steps", "4", "--output-dir", str(out))
    assert first.returncode == 0, first.stderr
    state = read_checkpoint(out / "checkpoints" / "last.pt")
    assert state["job_id"] == "job-first" and state["global_step"] == 4
    assert len(state["spec_hash"]) == 64

    # The same job restarted resumes (its id and spec are the checkpoint's) ...
    again = hetero_train(*RUN, "--steps", "6", "--output-dir", str(out), "--resume", "auto")
    assert again.returncode == 0, again.stderr
    assert read_checkpoint(out / "checkpoints" / "last.pt")["global_step"] == 6

    # ... another job with the same directory is refused, in one line, naming both.
    monkeypatch.setenv("HETERO_JOB_ID", "job-second")
    second = hetero_train(*RUN, "--steps", "8", "--output-dir", str(out), "--resume", "auto")
    assert second.returncode != 0
    errors = [line for line in second.stderr.splitlines() if line.strip()]
    assert "Traceback" not in second.stderr and len(errors) == 1, second.stderr
    assert "job job-first" in errors[0] and "job job-second" in errors[0]
    assert read_checkpoint(out / "checkpoints" / "last.pt")["global_step"] == 6


def test_a_run_with_other_training_options_does_not_resume(hetero_train, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = hetero_train(*RUN, "--steps", "4", "--output-dir", str(out))
    assert first.returncode == 0, first.stderr
    other = hetero_train(
        *RUN, "--steps", "6", "--seed", "7", "--output-dir", str(out), "--resume", "auto"
    )
    assert other.returncode != 0
    assert "refusing to resume from another run's checkpoint" in other.stderr
    assert "Traceback" not in other.stderr


def test_a_planted_tmp_link_is_not_followed_and_the_checkpoint_is_written(
    hetero_train, tmp_path: Path
) -> None:
    """Issue 33: ``last.pt.tmp`` planted as a link to a file of ours (the coordinator's
    database, here a canary) before the job checkpoints: the canary stays as it was."""
    out, canary = tmp_path / "run", tmp_path / "coordinator.db"
    canary.write_bytes(b"canary")
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.pt.tmp").symlink_to(canary)
    proc = hetero_train(*RUN, "--steps", "4", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert canary.read_bytes() == b"canary", "the checkpoint followed the planted link"
    assert read_checkpoint(out / "checkpoints" / "last.pt")["global_step"] == 4


@pytest.mark.parametrize("mode", [0o777, 0o770], ids=["others", "group"])
def test_a_checkpoint_directory_others_can_write_is_refused_in_one_line(
    hetero_train, tmp_path: Path, mode: int
) -> None:
    out = tmp_path / "run"
    shared = tmp_path / "shared-checkpoints"
    shared.mkdir()
    shared.chmod(mode)
    proc = hetero_train(*RUN, "--steps", "4", "--checkpoint-dir", str(shared))
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert "writable by group or others" in errors[0]
    assert not list(shared.iterdir()), "something was written in the shared directory"
    assert not out.exists()


def test_a_linked_output_directory_is_refused_in_one_line(hetero_train, tmp_path: Path) -> None:
    """A metrics directory that is a link (to a directory another user controls)."""
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir()
    (out / "metrics").symlink_to(elsewhere)
    proc = hetero_train(*RUN, "--steps", "2", "--output-dir", str(out))
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert "symbolic link" in errors[0]
    assert not list(elsewhere.iterdir())
