"""Mixed precision for the built-in job: ``--amp none|bf16|fp16``.

bf16 keeps fp32's exponent range, so gradients need no scaling; fp16 does,
through ``torch.amp.GradScaler``. The scaler's inf/nan check runs on the
all-reduced gradients, which are identical on every rank, so every rank skips
the same steps and lowers its scale the same way. Autocast covers forward and
loss; parameters and optimizer state stay fp32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: The dtype of each mode of the catalogue's ``amp`` option but ``none`` (which checks them).
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, amp: str) -> torch.autocast:
    """Autocast for forward and loss in ``amp``'s dtype; a no-op for ``"none"``."""
    return torch.autocast(
        device_type=device.type, dtype=_DTYPES.get(amp, torch.bfloat16), enabled=amp in _DTYPES
    )


def grad_scaler(device: torch.device, amp: str) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16, ``None`` otherwise."""
    return torch.amp.GradScaler(device.type) if amp == "fp16" else None


class Autocast(nn.Module):
    """``module`` with its forward under autocast and a float32 output.

    For measurements that call ``loss_fn(model(x), y)`` themselves (the
    standalone ideal): the loss then sees the same kernels' output as training.
    """

    def __init__(self, module: nn.Module, device: torch.device, amp: str) -> None:
        super().__init__()
        self.module = module
        self.device = device
        self.amp = amp

    def forward(self, *args: Any) -> Any:
        with autocast(self.device, self.amp):
            out = self.module(*args)
        return out.float() if isinstance(out, torch.Tensor) else out
