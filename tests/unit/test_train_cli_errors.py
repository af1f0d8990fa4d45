"""hetero-train's new options: a user's mistake is one line on stderr and a non-zero exit."""

from __future__ import annotations

import pytest

from hetero.trainer.cli import main

LM = ["--model", "gpt2-tiny", "--dataset", "synthetic-text", "--seq-len", "8", "--quiet"]
FAST = ["--num-samples", "64", "--global-batch", "8", "--steps", "4", "--ideal-steps", "0"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--dataset", "synthetic"], "needs a text dataset"),
        (["--model", "debug", "--dataset", "synthetic-text"], "needs an image dataset"),
        (["--seq-len", "500"], "exceeds gpt2-tiny's 64 positions"),
        (["--activation-checkpointing", "sometimes"], "unknown value 'sometimes'"),
        (["--model", "debug", "--dataset", "cifar10", "--data-dir", "/nope"], "'/nope' does not"),
        (["--dataset", "text", "--data-dir", "/nope.txt"], "does not exist"),
        (["--simulate-nodes", "2", "--nproc", "3"], "leave out --nproc"),
        (["--memory-fraction", "2"], "must be in (0, 1]"),
        (["--max-batch", "4,4"], "2 caps for 1 ranks"),
        (["--memory-margin", "1.5"], "--memory-margin"),
        (["--pipeline", "2", "--nproc", "3"], "--pipeline 2 does not divide 3 ranks"),
        (["--model", "debug", "--dataset", "synthetic", "--pipeline", "2"], "cuts the built-in"),
        (["--pipeline", "2", "--shard", "full"], "--shard: not with --pipeline"),
    ],
)
def test_bad_input_is_a_one_line_error(capsys, args: list[str], message: str):
    code = main([*LM, *FAST, *args])
    err = capsys.readouterr().err
    assert code != 0
    assert any(message in line for line in err.splitlines()), err
    assert "Traceback" not in err


def test_out_of_memory_with_a_single_rank_is_a_one_line_error(capsys, monkeypatch):
    """One rank's batch is the global batch: there is nothing to shrink it into."""
    monkeypatch.setenv("HETERO_INJECT_OOM", "0:2:backward")
    code = main([*LM, *FAST, "--oom-retry", "--eval-samples", "0"])
    err = capsys.readouterr().err
    assert code != 0 and "out of memory at step 2 with batch 8 on the only rank" in err, err


@pytest.mark.parametrize(
    "build,platform,driver,expected",
    [
        ("2.14.1+cpu", "linux", True, False),  # a CPU-only build sees no CUDA device
        ("2.14.1+cu130", "linux", False, False),  # no libcuda.so.1: no CUDA device
        ("2.14.1+cu130", "linux", True, True),
        ("2.14.1", "linux", True, True),
        ("2.14.1+rocm6.4", "linux", False, True),  # HIP's GPUs count as CUDA devices
        ("2.14.1", "darwin", False, True),  # elsewhere torch is asked
    ],
)
def test_the_launcher_asks_torch_for_gpus_unless_none_can_exist(
    monkeypatch: pytest.MonkeyPatch, build: str, platform: str, driver: bool, expected: bool
) -> None:
    import ctypes
    import importlib.metadata
    import sys

    from hetero.trainer import cli

    def load(name: str) -> object:
        assert name == "libcuda.so.1"
        if not driver:
            raise OSError(f"{name}: cannot open shared object file")
        return object()

    monkeypatch.setattr(importlib.metadata, "version", lambda dist: build)
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(ctypes, "CDLL", load)
    assert cli._may_have_cuda() is expected
