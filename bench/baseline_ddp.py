"""Plain ``DistributedDataParallel`` with equal batches: the external baseline of ``hetero-bench run``.

Written outside hetero's trainer on purpose: no uneven sampler, no comm hook,
no plan exchange, DDP's default all-reduce. It shares only what makes the
comparison fair: the same model (``hetero.trainer.models``), the same
synthetic data gathered on the device (``SyntheticImages.get_batch``), SGD with
momentum 0.9, bf16 autocast around forward and loss, channels_last. It joins and
leaves the process group as the trainer does (``hetero.trainer.procgroup``), so
that a finished rank exits cleanly; that touches no step.

Timing: each step is cut by CUDA events (host clocks on CPU) at its start,
after the batch is gathered, after forward, after backward and at its end; every
``--rebalance-interval`` steps the rank synchronizes its device and writes one
record to ``OUTPUT_DIR/metrics/rank<R>.jsonl`` (same field names as
``hetero-train``'s: ``step``, ``samples_per_s`` over the interval's wall time,
``batch``, ``step_s``, ``forward_s`` (gather + forward), ``phases_s`` {data,
forward, backward, optimizer}, ``time_s``, ``interval_wall_s``). ``compute_s``
is ``null``: under plain DDP the backward pass includes the wait for the
slowest peer, so no compute-only time exists to report.

Ideal: after training, each rank alone (the others wait at a barrier) runs
``--ideal-steps`` full steps at its B/W batch on a copy of the model without
DDP, with hetero's definition (``hetero.trainer.ideal.solo_times``: the batch
gathered before the clock starts); the median step gives its standalone
samples/s; the sum is the ideal. The summary's ``solo`` holds each rank's phase
times alone and ``gap`` the gap breakdown (``hetero.core.verdict``).

``--emulate-slowdown`` (CPU only, as in ``hetero-train``) sleeps
``(factor − 1)`` × the rank's own compute time of a step (forward + backward,
measured alone before training), between forward and backward.

Run it as ``python -m hetero.bench.baseline_ddp --nproc 2 ...``: with
``--nproc N`` and no ``RANK`` in the environment it starts N local ranks
through ``hetero.trainer.launch`` (the same launcher as ``hetero-train``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

WARMUP_STEPS = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="baseline_ddp", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--image-size", type=int)
    p.add_argument(
        "--dataset",
        choices=("synthetic", "synthetic-text"),
        help="default: synthetic images, or synthetic text for a language model",
    )
    p.add_argument("--seq-len", type=int, help="language models: tokens per sample")
    p.add_argument("--global-batch", type=int, default=96)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rebalance-interval", type=int, default=10, help="steps per metrics record")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--num-samples", type=int, default=8192)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--amp", choices=("none", "bf16"), default="none")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--ideal-steps", type=int, default=8)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--backend", choices=("gloo", "nccl"))
    p.add_argument("--emulate-slowdown", metavar="RANK:FACTOR[@START-END],...")
    p.add_argument("--output-dir", type=Path)
    p.add_argument("--summary-json", type=Path)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.global_batch < args.nproc:
        print(f"error: --global-batch {args.global_batch} < --nproc {args.nproc}", file=sys.stderr)
        return 2
    if args.nproc > 1 and "RANK" not in os.environ:
        from hetero.trainer.launch import launch_local

        raw = list(argv) if argv is not None else sys.argv[1:]
        log_dir = args.output_dir / "logs" if args.output_dir else None
        cmd = [sys.executable, "-m", "hetero.bench.baseline_ddp", *raw]
        return launch_local(cmd, args.nproc, log_dir=log_dir)
    summary = train(args)
    if summary is not None:
        if args.summary_json:
            args.summary_json.parent.mkdir(parents=True, exist_ok=True)
            args.summary_json.write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary, indent=2))
    return 0


def train(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from hetero.core.gap import Solo, intervals_from_records
    from hetero.core.verdict import diagnose
    from hetero.trainer import procgroup
    from hetero.trainer.datasets.synthetic import SyntheticImages
    from hetero.trainer.datasets.text import SyntheticText
    from hetero.trainer.emulation import parse_slowdowns
    from hetero.trainer.ideal import solo_times
    from hetero.trainer.models import model_info
    from hetero.trainer.tasks import make_task

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    has_gpu = torch.cuda.is_available() and local_rank < torch.cuda.device_count()
    if args.device == "cuda" and not has_gpu:
        raise SystemExit(
            f"error: rank {rank}: --device cuda but no GPU for local rank {local_rank}"
        )
    if args.device == "cuda" or (args.device == "auto" and has_gpu):
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    cuda = device.type == "cuda"
    if args.emulate_slowdown and cuda:
        raise SystemExit("error: emulated slowdown is for CPU ranks; on GPUs use real load")
    my_slowdown = parse_slowdowns(args.emulate_slowdown).get(rank)

    def factor_at(step: int) -> float:
        return my_slowdown.factor_at(step) if my_slowdown else 1.0

    backend = args.backend or ("nccl" if cuda else "gloo")
    if world > 1:
        procgroup.join(backend, rank=rank, world_size=world, timeout=timedelta(minutes=10))
    torch.manual_seed(args.seed)

    info = model_info(args.model)
    task = make_task(info.task)
    # Language models: tokens per sample in place of pixels; no memory format; AdamW,
    # as hetero-train picks for them (SGD with momentum for image models).
    image_size = args.seq_len if task.text else args.image_size
    image_size = image_size or info.default_image_size
    fmt = torch.channels_last if args.channels_last and not task.text else torch.contiguous_format
    model = info.build(args.num_classes, image_size).to(device).to(memory_format=fmt)
    data: Any
    if task.text:
        windows = SyntheticText(
            args.num_samples, image_size, task.data_vocab(model), seed=args.seed
        )
        data = task.prepare(windows, model, seed=args.seed)
    else:
        data = SyntheticImages(args.num_samples, image_size, args.num_classes, seed=args.seed)
    ddp: nn.Module = (
        DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
        if world > 1
        else model
    )

    def make_optimizer(params: Any) -> Any:
        if task.text:
            return torch.optim.AdamW(params, lr=args.lr)
        return torch.optim.SGD(params, lr=args.lr, momentum=0.9)

    opt = make_optimizer(ddp.parameters())
    loss_fn = task.loss
    gb = args.global_batch
    sizes = [gb // world + (1 if r < gb % world else 0) for r in range(world)]
    lo = sum(sizes[:rank])
    mine = sizes[rank]

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16")

    perms: dict[int, Any] = {}

    def indices(step: int) -> list[int]:
        """This rank's slice of global batch ``step``: one seeded permutation per epoch."""
        epoch, k = divmod(step, max(args.num_samples // gb, 1))
        if epoch not in perms:
            perms.clear()
            g = torch.Generator().manual_seed(args.seed * 100_003 + epoch)
            perms[epoch] = torch.randperm(args.num_samples, generator=g)
        return perms[epoch][k * gb + lo : k * gb + lo + mine].tolist()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def fresh_copy() -> tuple[nn.Module, Any]:
        m = info.build(args.num_classes, image_size).to(device).to(memory_format=fmt)
        m.load_state_dict(model.state_dict())
        return m, make_optimizer(m.parameters())

    # The emulated slowdown's unit: this rank's own compute time, measured alone.
    own_compute_s = 0.0
    if args.emulate_slowdown:
        own = solo_times(
            lambda: fresh_copy()[0],
            opt,
            data,
            loss_fn,
            mine,
            steps=1,
            slowdown=1.0,
            device=device,
            seed=args.seed,
            amp=args.amp,
            memory_format=fmt,
        )
        own_compute_s = own.compute_s or 0.0

    out_dir: Path | None = args.output_dir
    metrics = None
    if out_dir is not None:
        (out_dir / "metrics").mkdir(parents=True, exist_ok=True)
        metrics = (out_dir / "metrics" / f"rank{rank}.jsonl").open("w")
    interval = max(1, args.rebalance_interval)
    rates: list[float] = []
    walls: list[float] = []
    records: list[dict[str, Any]] = []
    ddp.train()
    if world > 1:
        dist.barrier()
    sync()
    t_interval = t_start = time.perf_counter()
    # Per step: start, batch gathered, forward done, backward done, end (events on CUDA).
    marks: list[list[Any]] = []

    def mark() -> Any:
        if not cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def span(m: list[Any], a: int, b: int) -> float:
        return float(m[a].elapsed_time(m[b]) / 1e3 if cuda else m[b] - m[a])

    for step in range(args.steps):
        factor = factor_at(step)
        m = [mark()]
        x, y = data.get_batch(indices(step), device)
        m.append(mark())
        with autocast():
            loss = loss_fn(ddp(x.contiguous(memory_format=fmt)), y)
        m.append(mark())
        if factor > 1.0:
            time.sleep((factor - 1.0) * own_compute_s)
        loss.backward()
        m.append(mark())
        opt.step()
        opt.zero_grad(set_to_none=True)
        m.append(mark())
        marks.append(m)
        if (step + 1) % interval == 0 or step + 1 == args.steps:
            sync()
            now = time.perf_counter()
            wall = now - t_interval
            n = len(marks)
            step_s = [span(m, 0, 4) for m in marks]
            fwd_s = [span(m, 0, 2) for m in marks]
            phases = {
                name: statistics.mean(span(m, a, a + 1) for m in marks)
                for a, name in enumerate(("data", "forward", "backward", "optimizer"))
            }
            rate = gb * n / wall
            rates.append(rate)
            walls.append(wall)
            rec = {
                "step": step + 1,
                "rank": rank,
                "time_s": time.time(),
                "interval_wall_s": wall,
                "samples_per_s": rate,
                "loss": float(loss.detach().float().item()),
                "batch": mine,
                "steps_measured": n,
                "compute_s": None,
                "forward_s": statistics.mean(fwd_s),
                "step_s": statistics.mean(step_s),
                "phases_s": phases,
                "plan": sizes,
                "emulated": bool(args.emulate_slowdown),
                "slowdown": factor,
            }
            records.append(rec)
            if metrics is not None:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
            marks.clear()
            t_interval = time.perf_counter()
    train_wall_s = time.perf_counter() - t_start
    if metrics is not None:
        metrics.close()

    # Ideal: each rank alone at its B/W batch, one at a time, as hetero measures it.
    solos = [Solo(mine, 0.0)] * world
    if args.ideal_steps > 0:
        mine_solo = Solo(mine, 0.0)
        for r in range(world):
            if world > 1:
                dist.barrier()
            if r == rank:
                mine_solo = solo_times(
                    lambda: fresh_copy()[0],
                    opt,
                    data,
                    loss_fn,
                    mine,
                    steps=args.ideal_steps,
                    slowdown=factor_at(args.steps - 1),
                    device=device,
                    seed=args.seed,
                    amp=args.amp,
                    memory_format=fmt,
                )
        solos = [mine_solo]
        if world > 1:
            dist.barrier()
            solos = [None] * world  # type: ignore[list-item]
            dist.all_gather_object(solos, mine_solo)
    every_rank: list[Any] = [records]
    if world > 1:
        every_rank = [None] * world
        dist.all_gather_object(every_rank, records)
    standalone = [s.samples_per_s for s in solos]
    # DDP's reducer holds the process group: without the wrapper, leaving ends the group
    # and joins Gloo's threads now, not during interpreter exit (see hetero.trainer.procgroup).
    del ddp
    if world > 1:
        procgroup.leave()
    if rank != 0:
        return None
    steady = statistics.median(rates[len(rates) // 2 :]) if rates else 0.0
    ideal = sum(standalone) if args.ideal_steps > 0 and all(standalone) else None
    after_first = sum(walls[1:])
    gap = diagnose(
        intervals_from_records(every_rank),
        solos if ideal else None,
        steady_samples_per_s=steady or None,
    )
    return {
        "runner": "torch-ddp",
        "policy": "ddp",
        "model": args.model,
        "world_size": world,
        "backend": backend if world > 1 else None,
        "device": device.type,
        "amp": args.amp,
        "channels_last": args.channels_last,
        "global_batch": gb,
        "steps": args.steps,
        "final_plan": sizes,
        "plans": [{"version": 0, "apply_at_step": 0, "batches": sizes, "reason": "equal (DDP)"}],
        "train_wall_s": train_wall_s,
        "steady_samples_per_s": steady,
        "throughput_samples_per_s": (
            sum(r * w for r, w in zip(rates[1:], walls[1:], strict=True)) / after_first
            if after_first > 0
            else steady
        ),
        "standalone_samples_per_s": standalone if ideal else [],
        "solo": [asdict(s) for s in solos] if ideal else None,
        "gap": gap.to_dict() if gap is not None else None,
        "ideal_samples_per_s": ideal,
        "ideal_method": "sum over ranks of each rank alone at B/W (no DDP), the batch on the "
        f"device, median of {args.ideal_steps} steps"
        if ideal
        else "not measured (--ideal-steps 0)",
        "pct_of_ideal": 100.0 * steady / ideal if ideal else None,
        "emulated": bool(args.emulate_slowdown),
        "emulated_slowdown": args.emulate_slowdown,
    }


if __name__ == "__main__":
    sys.exit(main())
