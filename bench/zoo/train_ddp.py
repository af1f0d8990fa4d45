"""The model-zoo loop in plain PyTorch DDP: the baseline of the ``zoo-*`` scenarios.

The same model, data, optimizer (AdamW), precision and layout as ``train.py``,
written without hetero's trainer: ``DistributedDataParallel`` with its default
all-reduce, and equal batches (each global batch of *B* samples of one seeded
permutation per epoch cut into *W* parts of *B/W*, as ``DistributedSampler``
with a per-rank batch of *B/W*) through a ``DataLoader`` with workers (``loader``)
or gathered on the GPU (``device``). Launch it with torchrun like ``train.py``.

Timing, its own: CUDA events at the end of each step, just before the forward,
after backward and after the optimizer (host clocks on CPU); every
``--rebalance-interval`` steps it synchronizes and writes one record to
``OUTPUT_DIR/metrics/rank<R>.jsonl`` with hetero's field names: ``phases_s.data``
(the device idle before the forward: waiting for the batch), ``phases_s.backward``
(forward end to backward end, the wait for peers included, so ``compute_s`` is
``null``), ``phases_s.optimizer``, ``step_s``. For the ideal and the gap breakdown
it reuses hetero's definitions (``hetero.trainer.ideal.solo_times``: each rank
alone at *B/W*, the others at a barrier; ``hetero.core.verdict``), outside the loop.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from hetero.bench.zoo import LOADER_PATHS
from hetero.bench.zoo.train import data_for, parse_args, pipeline_fields, run
from hetero.bench.zoo.workloads import build_model, is_language_model, loss_fn
from hetero.core.gap import Solo, intervals_from_records
from hetero.core.verdict import diagnose, lines
from hetero.trainer.emulation import parse_slowdowns
from hetero.trainer.ideal import solo_times


def equal_batches(
    n: int, global_batch: int, rank: int, world: int, seed: int
) -> Iterator[list[int]]:
    """This rank's B/W indices of each global batch, epoch after epoch."""
    sizes = [global_batch // world + (r < global_batch % world) for r in range(world)]
    lo = sum(sizes[:rank])
    epoch = 0
    while True:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        for k in range(n // global_batch):
            yield perm[k * global_batch + lo : k * global_batch + lo + sizes[rank]].tolist()
        epoch += 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = args.device != "cpu" and torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(args.seed)
    slow = parse_slowdowns(args.emulate_slowdown).get(rank)

    text = is_language_model(args.model)
    size = args.seq_len if text else args.image_size
    model, source = build_model(args.model, args.num_classes, size)
    fmt = torch.channels_last if args.channels_last and not text else torch.contiguous_format
    model = model.to(device).to(memory_format=fmt)
    dataset, describe = data_for(args, rank)
    ddp = (
        DistributedDataParallel(model, device_ids=[local] if cuda else None) if world > 1 else model
    )
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.05)
    n = len(dataset)  # type: ignore[arg-type]
    indices = equal_batches(n, args.global_batch, rank, world, args.seed)
    batches: Iterator[Any]
    if args.data in LOADER_PATHS:
        batches = iter(
            DataLoader(
                dataset,
                batch_sampler=indices,
                num_workers=args.num_workers,
                pin_memory=cuda,
                prefetch_factor=2 if args.num_workers else None,
                persistent_workers=args.num_workers > 0,
            )
        )
    else:
        batches = (dataset.get_batch(idx, device) for idx in indices)  # type: ignore[attr-defined]
    mine = args.global_batch // world + (rank < args.global_batch % world)
    if rank == 0:
        print(
            f"zoo-ddp: {source}, {world} ranks, equal batches of {mine}; {describe()}", flush=True
        )

    def fresh_copy() -> torch.nn.Module:
        copy, _ = build_model(args.model, args.num_classes, size)
        copy.load_state_dict(model.state_dict())
        return copy.to(device).to(memory_format=fmt)

    def alone(steps: int, factor: float) -> Solo:
        return solo_times(
            fresh_copy,
            optimizer,
            dataset,
            loss_fn,
            mine,
            steps=steps,
            slowdown=factor,
            device=device,
            seed=args.seed,
            amp=args.amp,
            memory_format=fmt,
        )

    # The emulated slowdown's unit (CPU only): this rank's own compute, measured alone.
    own_compute_s = (alone(2, 1.0).compute_s or 0.0) if slow else 0.0
    records = train(args, ddp, optimizer, batches, device, rank, mine, slow, own_compute_s)

    solos: list[Solo] = []
    if args.ideal_steps > 0:
        mine_solo = Solo(mine, 0.0)
        for turn in range(world):
            if world > 1:
                dist.barrier()
            if turn == rank:
                factor = slow.factor_at(args.steps - 1) if slow else 1.0
                mine_solo = alone(args.ideal_steps, factor)
        solos = gather_solos(mine_solo, world, device)
    every_rank: list[Any] = [records]
    if world > 1:
        every_rank = [None] * world
        dist.all_gather_object(every_rank, records)

        del ddp
        dist.destroy_process_group()
    if rank == 0:
        summary = summarize(args, every_rank, solos, source)
        print("\n".join(lines(summary["gap"])) if summary["gap"] else "gap: n/a", flush=True)
        if args.summary_json:
            args.summary_json.parent.mkdir(parents=True, exist_ok=True)
            args.summary_json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def train(
    args: Any,
    ddp: Any,
    optimizer: Any,
    batches: Iterator[Any],
    device: torch.device,
    rank: int,
    mine: int,
    slow: Any,
    own_compute_s: float,
) -> list[dict[str, Any]]:
    """The training loop: per-step events, one metrics record per interval."""
    cuda = device.type == "cuda"
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    path = args.output_dir / "metrics" / f"rank{rank}.jsonl" if args.output_dir else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    marks: list[list[Any]] = []  # per step: end of previous step, forward begin, backward end, end

    def mark() -> Any:
        if not cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def span(a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if cuda else float(b - a)

    ddp.train()
    if dist.is_initialized():
        dist.barrier()
    prev_end = mark()
    t_interval = time.perf_counter()
    for step in range(args.steps):
        x, y = (t.to(device, non_blocking=True) for t in next(batches))
        if x.dim() == 4:
            x = x.contiguous(memory_format=fmt)
        fwd = mark()
        with torch.autocast(device.type, torch.bfloat16, enabled=args.amp == "bf16"):
            loss = loss_fn(ddp(x), y)
        factor = slow.factor_at(step) if slow else 1.0
        if factor > 1.0:
            time.sleep((factor - 1.0) * own_compute_s)
        loss.backward()
        bwd = mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = mark()
        marks.append([prev_end, fwd, bwd, end])
        prev_end = end
        if (step + 1) % args.rebalance_interval == 0 or step + 1 == args.steps:
            if cuda:
                torch.cuda.synchronize(device)
            wall = time.perf_counter() - t_interval
            timed = marks[1:] or marks  # the first step's gap includes the interval's sync
            phases = {
                name: statistics.fmean(span(m[a], m[b]) for m in timed)
                for name, a, b in (("data", 0, 1), ("backward", 1, 2), ("optimizer", 2, 3))
            }
            rec = {
                "step": step + 1,
                "rank": rank,
                "time_s": time.time(),
                "interval_wall_s": wall,
                "samples_per_s": args.global_batch * len(marks) / wall,
                "batch": mine,
                "steps_measured": len(timed),
                "compute_s": None,
                "phases_s": phases,
                "step_s": statistics.fmean(span(m[0], m[3]) for m in timed),
                "loss": float(loss.detach().float().item()),
                "emulated": bool(args.emulate_slowdown or args.input_cost_ms),
                "slowdown": factor,
            }
            records.append(rec)
            if path is not None:
                with path.open("a") as fh:
                    fh.write(json.dumps(rec) + "\n")
            marks.clear()
            prev_end = mark()
            t_interval = time.perf_counter()
    return records


def gather_solos(mine: Solo, world: int, device: torch.device) -> list[Solo]:
    """Every rank's solo measurement (NaN stands for a phase not measured)."""
    if world == 1:
        return [mine]
    nan = float("nan")
    vals = [
        mine.batch,
        mine.samples_per_s,
        mine.data_s or nan,
        mine.compute_s or nan,
        mine.optimizer_s or nan,
    ]
    local = torch.tensor(vals, dtype=torch.float64, device=device)
    out = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(out, local)
    return [Solo(int(t[0]), float(t[1]), float(t[2]), float(t[3]), float(t[4])) for t in out]


def summarize(
    args: Any, every_rank: list[list[dict[str, Any]]], solos: list[Solo], source: str
) -> dict[str, Any]:
    """Rank 0's summary of the run, with the gap breakdown over every rank's records."""
    world = len(every_rank)
    rates = [r["samples_per_s"] for r in every_rank[0]]
    steady = statistics.median(rates[len(rates) // 2 :]) if rates else 0.0
    known = solos and all(s.samples_per_s > 0 for s in solos)
    ideal = sum(s.samples_per_s for s in solos) if known else None
    bd = diagnose(
        intervals_from_records(every_rank),
        solos if known else None,
        steady_samples_per_s=steady or None,
    )
    plan = [args.global_batch // world + (r < args.global_batch % world) for r in range(world)]
    return {
        "runner": "torch-ddp",
        "policy": "ddp",
        "model": args.model,
        "model_source": source,
        "data_path": args.data,
        "num_workers": args.num_workers if args.data in LOADER_PATHS else 0,
        "world_size": world,
        "amp": args.amp,
        "optimizer": "AdamW",
        "global_batch": args.global_batch,
        "steps": args.steps,
        "final_plan": plan,
        "plans": [{"version": 0, "apply_at_step": 0, "batches": plan, "reason": "equal (DDP)"}],
        "steady_samples_per_s": steady,
        "standalone_samples_per_s": [s.samples_per_s for s in solos],
        "solo": [asdict(s) for s in solos] or None,
        "ideal_samples_per_s": ideal,
        "pct_of_ideal": 100.0 * steady / ideal if ideal else None,
        "gap": bd.to_dict() if bd is not None else None,
        "emulated": bool(args.emulate_slowdown or args.input_cost_ms),
        "emulated_slowdown": args.emulate_slowdown,
    } | pipeline_fields(args)


if __name__ == "__main__":
    sys.exit(run(main))
