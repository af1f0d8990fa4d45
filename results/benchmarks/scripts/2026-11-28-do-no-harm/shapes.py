"""What a new batch size costs a model's first step on a GPU, and where.

ConvNeXt-T (timm), bf16 autocast, channels_last, AdamW-free (forward + backward):
seconds of the first step at each new batch size against a warm step, with cuDNN
as PyTorch sets it, and with cuDNN's benchmark cache cleared in between.
Run: python shapes.py [model]
"""

import sys
import time

import timm
import torch

name = sys.argv[1] if len(sys.argv) > 1 else "convnext_tiny"
torch.manual_seed(0)
model = timm.create_model(name, num_classes=1000).cuda().to(memory_format=torch.channels_last)
loss_fn = torch.nn.CrossEntropyLoss()


def step(b: int) -> float:
    x = torch.randn(b, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (b,), device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.autocast("cuda", torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    torch.cuda.synchronize()
    return time.perf_counter() - t


for _ in range(3):
    step(128)
print(f"{name} warm 128: {step(128) * 1e3:.1f} ms", flush=True)
for b in (156, 100, 179, 77):
    first = step(b)
    again = step(b)
    print(f"first {b}: {first * 1e3:.1f} ms, second {again * 1e3:.1f} ms", flush=True)
torch.backends.cudnn.benchmark_limit = 1
for b in (140, 116):
    first = step(b)
    print(
        f"benchmark_limit=1 first {b}: {first * 1e3:.1f} ms, second {step(b) * 1e3:.1f}", flush=True
    )
torch.backends.cudnn.enabled = False
for b in (150, 106):
    first = step(b)
    print(f"cudnn off first {b}: {first * 1e3:.1f} ms, second {step(b) * 1e3:.1f}", flush=True)
