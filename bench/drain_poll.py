"""What stopping on SIGTERM costs a step: the time of ``StopRequest.poll`` on the step path.

``python -m hetero.bench.drain_poll --nproc 3 --steps 500`` runs a tiny model
(``DebugNet``, global batch 48) through the trainer API with ``ctx.stop_on_sigterm()``
on ``--nproc`` Gloo ranks and times each step's ``poll`` with the host clock (on a
poll step: wait for the previous poll's all-reduce of the flag, issue this one's;
``--every-step`` polls every step, as without the pacing of ``hetero.trainer.drain``). Rank 0 prints one
line: the polls' mean, median, 99th percentile and maximum in microseconds, and the
median step for scale. No signal is sent: this is the cost every step pays.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

from hetero.core.rankenv import RankEnv


def rank_main(steps: int, every_step: bool) -> None:
    import torch
    from torch import nn

    from hetero import trainer as ht
    from hetero.trainer import drain
    from hetero.trainer.datasets import SyntheticImages
    from hetero.trainer.models.vision import DebugNet

    if every_step:
        drain.POLL_PERIOD_S = 0.0
    torch.manual_seed(0)
    ctx = ht.init("equal", rebalance_interval=50, warmup_steps=0)
    model = ctx.wrap(DebugNet(num_classes=10, image_size=8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ctx.loader(SyntheticImages(48 * 50, 8, 10, seed=1), 48, seed=5)
    ctx.stop_on_sigterm()
    stop = ctx._stop
    assert stop is not None
    polls: list[float] = []
    poll = stop.poll

    def timed(step: int) -> bool:
        t0 = time.perf_counter()
        try:
            return poll(step)
        finally:
            polls.append(time.perf_counter() - t0)

    stop.poll = timed  # type: ignore[method-assign]
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
        us = sorted(p * 1e6 for p in polls[10:])  # past the first steps' warm-up
        step_ms = statistics.median(b - a for a, b in itertools.pairwise(starts)) * 1e3
        print(
            f"{ctx.world_size} Gloo ranks, {len(us)} steps: poll mean {statistics.mean(us):.0f} "
            f"us, p50 {us[len(us) // 2]:.0f} us, p99 {us[int(len(us) * 0.99)]:.0f} us, "
            f"max {us[-1]:.0f} us; median step {step_ms:.2f} ms, polling every {stop.every} steps",
            flush=True,
        )
    del model
    ctx.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every-step", action="store_true", help="poll at every step")
    args = parser.parse_args(argv)
    if RankEnv.distributed():
        rank_main(args.steps, args.every_step)
        return 0
    from hetero.trainer.launch import launch_local

    cmd = [sys.executable, "-m", "hetero.bench.drain_poll", *(argv or sys.argv[1:])]
    return launch_local(cmd, args.nproc, backend="gloo")


if __name__ == "__main__":
    sys.exit(main())
