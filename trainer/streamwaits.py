"""Compute-only time of sharded CUDA ranks: the compute stream's waits for FSDP2's collectives.

On CUDA, FSDP2 runs its all-gathers and reduce-scatters on their own streams and the
host does not block in them; the *compute stream* does. Before a unit's forward (and,
under ``shard=full``, its backward) ``wait_for_unshard`` makes the compute stream wait
for that unit's all-gather, which cannot finish before the slowest peer has joined it;
``post_backward`` hands the unit's gradients to the reduce-scatter and, to bound the
memory of buffers in flight, makes the compute stream wait for an earlier
reduce-scatter; the end of backward (``finalize_backward`` and the root's final
callback) waits for the last ones. A fast rank's GPU sits idle in those waits, so
the span from the first forward to the end of backward is the *slowest* rank's
compute on every rank, and a planner fed that span sees every rank alike and never
moves (measured on 2x H100 with a neighbour on one GPU: 29 and 27 ms a sample).

:func:`attach` wraps those methods of every FSDP2 parameter group so that each call
is bracketed by two CUDA events on the compute stream; the step clock subtracts the
time between them (and from the last ``post_backward`` to ``grads_ready``, the
finalisation waits) from forward and backward and counts it as communication
(``StepClock.add_stream_wait``). What remains is the time the compute stream ran this
rank's own kernels. The methods are FSDP2's parameter-group internals (present in
torch 2.11 and 2.14); where they are missing the ranks keep the old, wait-including
time and a warning says so.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger("hetero.trainer.streamwaits")

#: The parameter-group methods in which the compute stream waits for peers.
WAITING = ("wait_for_unshard", "post_backward", "finalize_backward")

Record = Callable[["torch.cuda.Event", "torch.cuda.Event"], None]


def param_groups(module: Any) -> list[Any]:
    """The FSDP2 parameter groups of one ``fully_shard``-ed module (none if not found)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return []
    state = get_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # older FSDP2: one group per module, or none
        one = getattr(state, "_fsdp_param_group", None)
        groups = [one] if one is not None else []
    return list(groups)


def attach(modules: Sequence[Any], record: Record) -> int:
    """Bracket every waiting method of every group of ``modules`` with events handed to
    ``record(begin, end)``; the number of methods wrapped (0: none found, warned)."""
    wrapped = 0
    for module in modules:
        for group in param_groups(module):
            for name in WAITING:
                method = getattr(group, name, None)
                if method is not None and not getattr(method, "_hetero_timed", False):
                    setattr(group, name, _bracketed(method, record))
                    wrapped += 1
    if not wrapped:
        log.warning(
            "FSDP2's parameter groups were not found (torch %s): compute time on CUDA "
            "ranks includes the waits for peers' collectives",
            torch.__version__,
        )
    return wrapped


def _bracketed(method: Callable[..., Any], record: Record) -> Callable[..., Any]:
    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        begin = torch.cuda.Event(enable_timing=True)
        begin.record()
        try:
            return method(*args, **kwargs)
        finally:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            record(begin, end)

    timed._hetero_timed = True  # type: ignore[attr-defined]
    return timed
