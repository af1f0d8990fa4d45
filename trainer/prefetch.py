"""Moving a loader's batches to the rank's device, the next one on a side stream (CUDA).

A batch copied with ``.to(device, non_blocking=True)`` on the compute stream
is GPU time the step waits for: the copy runs between the previous step's
optimizer and this step's forward. On 2x H100 that gap was 0.8-2.7 ms per step
for 224 px image batches from a ``DataLoader``; copying the *next* batch on a
side stream while this one computes removed it (gap 0.0).

:func:`device_batches` does that for any nesting of tensors in lists, tuples,
named tuples and dicts:

1. it takes batch *k+1* from the source and issues its copy on a side stream,
   recording an event there, *before* handing out batch *k*;
2. handing out batch *k*, it makes the current (compute) stream wait for *k*'s
   event, and marks each of *k*'s tensors as used by the compute stream
   (``record_stream``), so the caching allocator does not give their memory to
   the side stream's next copy while the compute stream may still read it.

The copies are asynchronous only from pinned host memory (``pin_memory=True``,
the default on CUDA ranks). This is the pattern of NVIDIA Apex's ImageNet
example (``data_prefetcher``), written out here because the libraries that
package it (torchtnt's ``CudaDataPrefetcher``) bring a training framework for
thirty lines. On CPU, batches pass through ``to_device`` in order, as before.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from typing import Any

import torch


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it moved to ``device`` (``non_blocking``);
    lists, tuples, named tuples and dicts are rebuilt, other leaves kept as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(b, device) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def tensors_in(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``batch``, depth first, in the nesting :func:`to_device` knows."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            yield from tensors_in(b)
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from tensors_in(v)


def device_batches(source: Iterable[Any], device: torch.device) -> Generator[Any, None, None]:
    """``source``'s batches on ``device``, in order; on CUDA each one's copy overlaps the
    previous one's compute (see the module doc). Draws one batch ahead of the caller."""
    if device.type != "cuda":
        for batch in source:
            yield to_device(batch, device)
        return
    side = torch.cuda.Stream(device)
    ahead: tuple[Any, torch.cuda.Event] | None = None
    for batch in source:
        with torch.cuda.stream(side):
            moved = to_device(batch, device)
        ready = torch.cuda.Event()
        ready.record(side)
        if ahead is not None:
            yield _hand_over(*ahead, device)
        ahead = (moved, ready)
    if ahead is not None:
        yield _hand_over(*ahead, device)


def _hand_over(batch: Any, ready: torch.cuda.Event, device: torch.device) -> Any:
    compute = torch.cuda.current_stream(device)
    compute.wait_event(ready)
    for t in tensors_in(batch):
        t.record_stream(compute)
    return batch
