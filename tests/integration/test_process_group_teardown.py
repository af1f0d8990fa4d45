"""Leaving the process group ends it: no Gloo thread runs into interpreter finalization.

A Gloo worker alive while the interpreter finalizes can abort a finished rank with
exit status 134 ("terminate called without an active exception"; the why is in
``hetero.trainer.procgroup``). The abort needs an unlucky schedule; the condition
for it does not: these runs check that every thread of the group is gone once
hetero-train's job (replicated or sharded), or the plain-DDP baseline, returns.
"""

from __future__ import annotations

import sys

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="reads thread names from /proc"
    ),
]

COMMON = [
    "--model",
    "debug",
    "--num-samples",
    "64",
    "--global-batch",
    "8",
    "--steps",
    "4",
    "--rebalance-interval",
    "2",
    "--ideal-steps",
    "1",
    "--device",
    "cpu",
]


def test_hetero_train_ranks_end_their_process_group(run_ranks) -> None:
    run_ranks("teardown.py", 2, "train", *COMMON, "--quiet", "--json")


@pytest.mark.parametrize("shard", ["full", "grad_op"])
def test_sharded_ranks_end_their_process_group(run_ranks, shard: str) -> None:
    # FSDP2's device mesh holds the group, and DTensor's caches hold the mesh.
    run_ranks("teardown.py", 2, "train", *COMMON, "--shard", shard, "--quiet", "--json")


def test_baseline_ranks_end_their_process_group(run_ranks) -> None:
    run_ranks("teardown.py", 2, "baseline", *COMMON)


@pytest.mark.parametrize("shard", ["none", "full"])
def test_custom_loop_ranks_end_their_process_group(run_ranks, shard: str) -> None:
    # examples/custom_loop.py's shape: close() with the model alive, dropped on return.
    run_ranks("teardown.py", 2, "loop", shard)
