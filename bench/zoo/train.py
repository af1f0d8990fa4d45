"""A user's training loop on a model-zoo model, through hetero's public API.

Launched as users launch theirs::

    torchrun --nproc-per-node 2 -m hetero.bench.zoo.train --model vit_base_patch16_224 \\
        --data loader --num-workers 6 --global-batch 256 --amp bf16 --steps 200 \\
        --output-dir runs/vit --summary-json runs/vit/summary.json

``--data jpeg`` decodes JPEG files with PIL and applies the ImageNet recipe per
sample in the workers (``zoo.jpeg``); ``--loader-jitter`` adds a seeded
heavy-tailed delay per sample in the workers and ``--input-cost-ms`` an EMULATED
busy-wait (``zoo.delays``).

It reads top to bottom like a plain DDP script with hetero's five calls
(``ht.init``, ``ctx.wrap``, ``ctx.loader``, ``ctx.backward``, ``ctx.step``);
after training it measures each rank alone at its final batch
(``ctx.measure_ideal``) and prints where the throughput missing from that ideal
went (``ctx.report()``). ``train_ddp.py`` is the same loop in plain DDP.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hetero import trainer as ht
from hetero.bench.zoo import DATA_PATHS, LOADER_PATHS, parse_sides
from hetero.bench.zoo.delays import parse_input_cost, parse_jitter
from hetero.bench.zoo.workloads import build_data, build_model, is_language_model, loss_fn
from hetero.core.balancer import DeviceProfile
from hetero.core.errors import HeteroError


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hetero.bench.zoo.train", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="vit_base_patch16_224", help="timm name or hetero model")
    p.add_argument(
        "--data",
        choices=DATA_PATHS,
        default="loader",
        help="data path: loader (uint8 images or token windows made per sample in DataLoader "
        "workers), jpeg (JPEG files decoded with PIL + RandomResizedCrop + flip + normalize per "
        "sample in the workers), device (batches gathered on the device, no workers)",
    )
    p.add_argument(
        "--num-workers", type=int, default=6, help="DataLoader workers per rank (loader, jpeg)"
    )
    p.add_argument(
        "--loader-jitter",
        metavar="SPEC",
        help="sleep per sample in the workers, seeded and heavy-tailed: mean_ms=M[,sigma=S]"
        "[,stall_p=P,stall_ms=T] (lognormal of mean M ms and log-space spread S, default 1, "
        "plus a T ms stall with probability P), e.g. mean_ms=2,sigma=1.2,stall_p=0.002,"
        "stall_ms=150; stands for a real pipeline's variance (loader, jpeg)",
    )
    p.add_argument(
        "--input-cost-ms",
        metavar="SPEC",
        help="EMULATED decode cost: busy-wait per sample in the workers, MS on every rank or "
        "RANK:MS,... (e.g. 1:6 makes rank 1 input-bound); for CPU tests (loader, jpeg)",
    )
    p.add_argument(
        "--jpeg-sides",
        metavar="MIN-MAX",
        default="320-480",
        help="sides of the jpeg path's files, px (default 320-480: about ImageNet's training "
        "images; smaller files decode faster)",
    )
    p.add_argument("--tokens", type=Path, help="token file of a language model (zoo.tokens)")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sample")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--num-samples", type=int, default=8192, help="images in the dataset")
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--amp", choices=("none", "bf16"), default="bf16")
    p.add_argument("--channels-last", action="store_true", help="CNNs: channels_last layout")
    p.add_argument("--policy", default="dynamic")
    p.add_argument("--rebalance-interval", type=int, default=10)
    p.add_argument("--compute-scores", help="relative speed per rank (proportional, hybrid)")
    p.add_argument("--emulate-slowdown", help="CPU ranks only, e.g. 1:2 (EMULATED)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--ideal-steps", type=int, default=8, help="steps per rank alone; 0 skips")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", type=Path)
    p.add_argument("--summary-json", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scores = args.compute_scores.split(",") if args.compute_scores else []
    profiles = [DeviceProfile(f"rank{r}", float(x)) for r, x in enumerate(scores)] or None
    ctx = ht.init(
        args.policy,
        rebalance_interval=args.rebalance_interval,
        device=args.device,
        output_dir=args.output_dir,
        emulate_slowdown=args.emulate_slowdown,
        profiles=profiles,
    )
    try:
        summary = train(ctx, args)
    finally:
        ctx.close()
    if ctx.rank == 0 and args.summary_json:
        args.summary_json.parent.mkdir(parents=True, exist_ok=True)
        args.summary_json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def train(ctx: ht.Context, args: argparse.Namespace) -> dict[str, object]:
    torch.manual_seed(args.seed)
    text = is_language_model(args.model)
    size = args.seq_len if text else args.image_size
    model, source = build_model(args.model, args.num_classes, size)
    fmt = torch.channels_last if args.channels_last and not text else torch.contiguous_format
    model = model.to(memory_format=fmt)
    dataset, describe = data_for(args, ctx.rank)

    ddp_model = ctx.wrap(model)
    optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=args.lr, weight_decay=0.05)
    workers = args.num_workers if args.data in LOADER_PATHS else 0
    loader = ctx.loader(dataset, args.global_batch, seed=args.seed, num_workers=workers)
    if ctx.rank == 0:
        params = sum(p.numel() for p in model.parameters())
        emu = f", EMULATED slowdown {args.emulate_slowdown}" if args.emulate_slowdown else ""
        print(
            f"zoo: {source} ({params / 1e6:.1f} M parameters), {ctx.world_size} ranks "
            f"[{ctx.backend}/{ctx.device.type}], policy {args.policy}, global batch "
            f"{args.global_batch}, amp {args.amp}{emu}\n"
            f"zoo: data path {args.data} ({workers} workers): {describe()}",
            flush=True,
        )

    ddp_model.train()
    while ctx.global_step < args.steps:
        for x, y in loader:
            if x.dim() == 4:
                x = x.contiguous(memory_format=fmt)
            with torch.autocast(ctx.device.type, torch.bfloat16, enabled=args.amp == "bf16"):
                loss = loss_fn(ddp_model(x), y)
            ctx.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ctx.step(loss)
            if ctx.global_step >= args.steps:
                break

    if args.ideal_steps > 0:

        def fresh_copy() -> torch.nn.Module:
            copy, _ = build_model(args.model, args.num_classes, size)
            copy.load_state_dict(model.state_dict())
            return copy.to(ctx.device).to(memory_format=fmt)

        ctx.measure_ideal(
            fresh_copy,
            optimizer,
            dataset,
            loss_fn,
            steps=args.ideal_steps,
            amp=args.amp,
            memory_format=fmt,
            seed=args.seed,
        )
    summary = ctx.report()
    return summary | {
        "runner": "hetero-api",
        "model": args.model,
        "model_source": source,
        "data_path": args.data,
        "num_workers": workers,
        **pipeline_fields(args),
        "emulated": bool(summary.get("emulated")) or bool(args.input_cost_ms),
        "amp": args.amp,
        "channels_last": fmt is torch.channels_last,
        "optimizer": "AdamW",
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def data_for(args: argparse.Namespace, rank: int) -> tuple[Dataset[Any], Callable[[], str]]:
    """The dataset of ``args`` on ``rank`` and a line describing it (both loops)."""
    return build_data(
        args.model,
        path=args.data,
        num_samples=args.num_samples,
        image_size=args.image_size,
        num_classes=args.num_classes,
        tokens=args.tokens,
        seq_len=args.seq_len,
        seed=args.seed,
        rank=rank,
        jitter=parse_jitter(args.loader_jitter),
        input_cost=parse_input_cost(args.input_cost_ms),
        jpeg_sides=parse_sides(args.jpeg_sides),
    )


def pipeline_fields(args: argparse.Namespace) -> dict[str, object]:
    """The summary's record of the input pipeline's added delays (both loops)."""
    return {
        "loader_jitter": args.loader_jitter,
        "input_cost_ms": args.input_cost_ms,
        "jpeg_sides": args.jpeg_sides if args.data == "jpeg" else None,
        "emulated_input_cost": bool(args.input_cost_ms),
    }


def run(entry: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """``entry(argv)`` with hetero's errors as one line on stderr and a non-zero exit."""
    try:
        return entry(argv)
    except HeteroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(run(main))
