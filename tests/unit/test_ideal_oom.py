"""The ideal's standalone measurement on a rank held to its memory cap."""

from __future__ import annotations

import torch

from hetero.trainer import init
from hetero.trainer.datasets import SyntheticImages
from hetero.trainer.ideal import measure_standalone


def test_a_standalone_measurement_that_runs_out_of_memory_gives_no_rate_instead_of_a_crash() -> (
    None
):
    ctx = init("equal", device="cpu")
    try:

        def no_room() -> torch.nn.Module:
            raise torch.OutOfMemoryError("CUDA out of memory (a second model beside the first)")

        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        data = SyntheticImages(16, 8, 2)
        rates = measure_standalone(
            ctx, no_room, optimizer, data, torch.nn.functional.cross_entropy, (4,), steps=1, seed=0
        )
        assert rates == [0.0]
    finally:
        ctx.close()
