"""Speed-sized pipeline stages against the even split, on Gloo ranks of this host.

``python -m hetero.bench.pipeline --stages 2 --slowdown 1,2`` profiles a gpt2-tiny of
``--layers`` blocks on rank 0 at the microbatch size, splits it with
:func:`hetero.core.stages.partition` for devices whose speeds are the inverse of the
emulated slowdowns (``hetero.trainer.emulation``: a stage waits ``(f − 1)`` times its
own compute after each pass), and trains the even split and the speed-sized one in
turn. It prints, for each, the blocks a stage, the predicted and the measured seconds a
microbatch of each stage (its own compute and wait, not its waits for neighbours), and
the predicted and measured step; then the speeds the even run measured
(:func:`hetero.core.stages.measured_speeds`) and the split they give. Heterogeneity
here is EMULATED, and every line says so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

from hetero.core.stages import (
    Device,
    Partition,
    Pipeline,
    Schedule,
    even_partition,
    measured_speeds,
    partition,
    step_seconds,
)
from hetero.trainer.launch import launch_local
from hetero.trainer.models.transformer import GPT, BertMLM, build_transformer
from hetero.trainer.pipeline import build, profile


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hetero.bench.pipeline")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--slowdown", default="1,2", help="each stage's emulated slowdown")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--microbatch", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--schedule", default="1f1b", choices=[s.value for s in Schedule])
    p.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _model(a: argparse.Namespace) -> GPT | BertMLM:
    torch.manual_seed(0)
    return build_transformer(
        "gpt2-tiny",
        max_seq_len=a.seq_len,
        n_layers=a.layers,
        d_model=a.d_model,
        d_ff=4 * a.d_model,
    )


def _batch(a: argparse.Namespace, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 256, (a.microbatch * a.microbatches, a.seq_len + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _run(
    a: argparse.Namespace, split: Partition, factors: list[float]
) -> tuple[float, list[float]]:
    """Median seconds a step and each stage's seconds a microbatch, after a warm-up."""
    pipe = build(_model(a), split.bounds, a.microbatch, schedule=Schedule(a.schedule))
    pipe.clock.slowdown = factors[dist.get_rank()]
    opt = torch.optim.SGD(pipe.module.parameters(), lr=0.01)
    steps = []
    for step in range(a.steps + 2):
        if step == 2:
            pipe.clock.take()
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        pipe.step(*_batch(a, step))
        opt.step()
        dist.barrier()
        if step >= 2:
            steps.append(time.perf_counter() - start)
    seconds, _, passes = pipe.clock.take()
    mine = seconds / max(passes, 1)
    stage_s: list[float] = [0.0] * dist.get_world_size()
    dist.all_gather_object(stage_s, mine)
    return statistics.median(steps), stage_s


def _rank(a: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    factors = [float(f) for f in a.slowdown.split(",")]
    pipe_cfg = Pipeline(a.microbatches, a.microbatch, Schedule(a.schedule))
    splits: list[Partition | None] = [None, None]
    costs = None
    if dist.get_rank() == 0:
        ids = _batch(a, 0)
        costs = profile(_model(a), ids[0][: a.microbatch], ids[1][: a.microbatch])
        devices = [Device(1.0 / f, 2**40) for f in factors]
        splits = [even_partition(costs, devices, pipe_cfg), partition(costs, devices, pipe_cfg)]
    dist.broadcast_object_list(splits, src=0)
    results = []
    for split in splits:
        assert split is not None
        results.append((split, *_run(a, split, factors)))
    if dist.get_rank() == 0:
        print(
            f"EMULATED slowdowns {a.slowdown}; gpt2-tiny {a.layers} blocks d={a.d_model} "
            f"seq {a.seq_len}; {a.microbatches} x {a.microbatch} samples; {a.schedule}"
        )
        for name, (split, step_s, stage_s) in zip(("even", "speed-sized"), results, strict=True):
            predicted = step_seconds(split.stage_seconds, a.microbatches)
            print(
                f"EMULATED {name:11} blocks {split.sizes} | stage s/microbatch predicted "
                + " ".join(f"{s * 1e3:.1f}ms" for s in split.stage_seconds)
                + " measured "
                + " ".join(f"{s * 1e3:.1f}ms" for s in stage_s)
                + f" | step predicted {predicted * 1e3:.0f}ms measured {step_s * 1e3:.0f}ms"
            )
        print(f"EMULATED speed-sized over even: {results[0][1] / results[1][1]:.2f}x step rate")
        # Speeds as the even run measured them, and the split they give: what a re-cut
        # at a checkpoint would choose.
        assert costs is not None
        speeds = measured_speeds(costs, results[0][0].bounds, results[0][2])
        recut = partition(costs, [Device(s, 2**40) for s in speeds], pipe_cfg)
        print(
            "EMULATED speeds read back from the even run: "
            + ", ".join(f"{s:.2f}" for s in speeds)
            + f" -> blocks {recut.sizes}"
        )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    a = _args(sys.argv[1:] if argv is None else argv)
    if a.rank_run:
        _rank(a)
        return 0
    if len(a.slowdown.split(",")) != a.stages:
        print(
            f"error: --slowdown gives {len(a.slowdown.split(','))} factors for {a.stages} stages",
            file=sys.stderr,
        )
        return 2
    cmd = [
        sys.executable,
        "-m",
        "hetero.bench.pipeline",
        *(sys.argv[1:] if argv is None else argv),
        "--rank-run",
    ]
    return launch_local(cmd, a.stages, extra_env={"OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    raise SystemExit(main())
