"""Per-sample peak memory of a training step with and without activation checkpointing.

Usage: python results/benchmarks/scripts/2026-11-27-recompute-memory-cpu/measure.py MODEL SIZE B1 B2

MODEL is a built-in model's name, or a model-zoo one as ``torchvision:NAME`` or
``timm:NAME`` (no pretrained weights), whose repeated blocks are recomputed as a
user's model is (``hetero.trainer.models.repeated``).

For each mode, one forward and backward at B1 and at B2 samples (SIZE pixels, CPU
tensors, fp32), the peak counted by PyTorch's own MemTracker
(torch.distributed._tools.mem_tracker: tensor bytes by kind, not the allocator's,
so the host's load does not move it); the line through the two peaks gives the
fixed part and the bytes per sample, as the trainer's memory probe fits them.
"""

import sys

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from hetero.trainer.models import build_model
from hetero.trainer.models.recompute import set_recompute
from hetero.trainer.models.repeated import attach

name, size, b1, b2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])


def zoo(spec: str) -> torch.nn.Module:
    """A torchvision or timm model with 10 classes, its repeated blocks given a switch."""
    lib, model = spec.split(":", 1)
    if lib == "timm":
        import timm

        m = timm.create_model(model, pretrained=False, num_classes=10, img_size=size)
    else:
        import torchvision

        m = torchvision.models.get_model(model, num_classes=10)
    found = attach(m)
    print(f"{spec}: recomputing {found.text() if found else 'nothing (no repeated blocks)'}")
    return m


def peak(on: bool, batch: int) -> float:
    torch.manual_seed(0)
    m = zoo(name) if ":" in name else build_model(name, 10, size)
    m.train()
    set_recompute(m, on)
    mt = MemTracker()
    mt.track_external(m)
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, 10, (batch,))
    with mt:
        torch.nn.functional.cross_entropy(m(x), y).backward()
    return float(mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


for on in (False, True):
    p1, p2 = peak(on, b1), peak(on, b2)
    slope = (p2 - p1) / (b2 - b1)
    print(
        f"{name} {size}px {'on ' if on else 'off'} fixed {(p1 - slope * b1) / 2**20:.1f} MiB  "
        f"per sample {slope / 2**20:.2f} MiB"
    )
