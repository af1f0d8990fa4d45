"""Several nodes on one GPU: ``hetero-train --simulate-nodes N --memory-fraction F``.

N ranks start on the local machine like ``--nproc N``, but all of them on
GPU 0 (``LOCAL_RANK=0`` for every rank), over Gloo (NCCL refuses two ranks on
one device; Gloo moves CUDA tensors through the host). Each rank caps its
allocator with ``torch.cuda.set_per_process_memory_fraction``: ``F`` for all,
or ``F0,F1,...`` one per rank, so a "16 GB node" can sit beside an "80 GB
node" on one card. The memory caps (:mod:`hetero.trainer.memory`) then see
each rank's fraction as its device, and the planner never gives a rank more
than its share holds.

The ranks share one GPU's compute, so this shows memory limits, plans, OOM
handling and convergence, not the speed of N real nodes; every output says
SIMULATED. Without a GPU the ranks run on the CPU and the fraction is ignored
(with a notice), which is how the tests exercise the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hetero.core.catalogue import BY_NAME, OptionError, TrainingOptions
from hetero.trainer.context import Context


def parse_fractions(text: str | None, world_size: int) -> list[float] | None:
    """``memory_fraction``: ``F`` for every rank or ``F0,F1,...`` one per rank; each in (0, 1]
    (the catalogue's syntax; an error is an ``OptionError`` naming ``memory_fraction``)."""
    if not text:
        return None
    values = [float(p) for p in BY_NAME["memory_fraction"].check(text).split(",")]
    if len(values) == 1:
        return values * world_size
    if world_size > 1 and len(values) != world_size:
        raise OptionError("memory_fraction", f"has {len(values)} values for {world_size} ranks")
    return values


def apply_memory_fraction(ctx: Context, fractions: list[float] | None) -> float | None:
    """Cap this rank's CUDA allocator at its fraction of the device; the fraction, or
    ``None`` when there is none to apply (no fraction given, or a CPU rank)."""
    if fractions is None or ctx.device.type != "cuda":
        return None
    mine = fractions[ctx.rank] if len(fractions) > ctx.rank else fractions[-1]
    torch.cuda.set_per_process_memory_fraction(mine, ctx.device)
    return mine


def launch_simulated(cfg: TrainingOptions, argv: list[str]) -> int:
    """Start ``simulate_nodes`` ranks on this machine, all on GPU 0."""
    from hetero.trainer.launch import launch_local

    run_dir = cfg.run_dir
    log_dir = Path(run_dir) / "logs" if run_dir else None
    cmd = [sys.executable, "-m", "hetero.trainer.cli", *argv]
    # Every rank on device 0: LOCAL_RANK picks the GPU (bootstrap.pick_device).
    return launch_local(cmd, cfg.simulate_nodes, log_dir=log_dir, extra_env={"LOCAL_RANK": "0"})
