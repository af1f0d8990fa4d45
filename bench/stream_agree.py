"""What a stream's pass agreement costs a step: the time of ``PassEnds.agree`` on the step path.

``python -m hetero.bench.stream_agree --nproc 2 --steps 600`` runs a tiny model
(``DebugNet``, global batch 48) through the trainer API on ``--nproc`` Gloo ranks over
a stream (an ``IterableDataset`` of synthetic images, read on the training thread) and
times each step's ``agree`` with the host clock (at an agreement's step: wait for the
previous all-reduce, issue this one's; ``--every-step`` agrees at every step, as
without the pacing of ``hetero.trainer.passend``). ``--map`` reads the same samples as
a map-style dataset instead, which needs no agreement, for the step time beside it.
Rank 0 prints one line: the agreements' mean, median, 99th percentile and maximum in
microseconds, the all-reduces per step, and the median step.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from hetero.core.rankenv import RankEnv


def rank_main(steps: int, every_step: bool, map_style: bool) -> None:
    import torch
    from torch import nn
    from torch.utils.data import IterableDataset

    from hetero import trainer as ht
    from hetero.trainer import passend
    from hetero.trainer.datasets import SyntheticImages
    from hetero.trainer.models.vision import DebugNet
    from hetero.trainer.streamloader import StreamLoader

    class Stream(IterableDataset[Any]):
        def __init__(self, images: SyntheticImages) -> None:
            self.images = images

        def __iter__(self) -> Iterator[Any]:
            return (self.images[i] for i in range(len(self.images)))

    if every_step:
        passend.MAX_PERIOD = 1
    torch.manual_seed(0)
    ctx = ht.init("equal", rebalance_interval=50, warmup_steps=0)
    model = ctx.wrap(DebugNet(num_classes=10, image_size=8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    images = SyntheticImages(48 * 40 * ctx.world_size, 8, 10, seed=1)
    dataset = images if map_style else Stream(images)
    loader = ctx.loader(dataset, 48, seed=5, collate_fn=torch.utils.data.default_collate)
    agreed: list[float] = []
    if isinstance(loader, StreamLoader):
        agree = loader.ends.agree

        def timed(step: int, read: int, short: int | None) -> bool:
            t0 = time.perf_counter()
            try:
                return agree(step, read, short)
            finally:
                agreed.append(time.perf_counter() - t0)

        loader.ends.agree = timed  # type: ignore[method-assign]
    loss_fn = nn.CrossEntropyLoss()
    starts: list[float] = []
    while ctx.global_step < steps:
        for x, y in loader:
            starts.append(time.perf_counter())
            ctx.backward(loss_fn(model(x), y))
            opt.step()
            opt.zero_grad()
            ctx.step()
            if ctx.global_step >= steps:
                break
    if ctx.rank == 0:
        step_ms = statistics.median(b - a for a, b in itertools.pairwise(starts)) * 1e3
        if agreed:
            us = sorted(a * 1e6 for a in agreed[10:])  # past the first steps' warm-up
            rounds = loader.ends.rounds / len(agreed)  # type: ignore[union-attr]
            line = (
                f"agree mean {statistics.mean(us):.0f} us, p50 {us[len(us) // 2]:.0f} us, p99 "
                f"{us[int(len(us) * 0.99)]:.0f} us, max {us[-1]:.0f} us, {rounds:.2f} "
                f"all-reduces a step (period {loader.ends.period})"  # type: ignore[union-attr]
            )
        else:
            line = "map-style dataset, no agreement"
        print(
            f"{ctx.world_size} Gloo ranks, {steps} steps: {line}; median step {step_ms:.2f} ms",
            flush=True,
        )
    del model
    ctx.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every-step", action="store_true", help="agree at every step")
    parser.add_argument("--map", action="store_true", help="a map-style dataset instead")
    args = parser.parse_args(argv)
    if RankEnv.distributed():
        rank_main(args.steps, args.every_step, args.map)
        return 0
    from hetero.trainer.launch import launch_local

    cmd = [sys.executable, "-m", "hetero.bench.stream_agree", *(argv or sys.argv[1:])]
    return launch_local(cmd, args.nproc, backend="gloo")


if __name__ == "__main__":
    sys.exit(main())
