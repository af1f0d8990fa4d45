"""Per-step phase timing, with compute-only time separated from communication.

DDP's all-reduce makes every rank's wall time equal the slowest rank's, so wall
time cannot find a straggler. A step is cut at these marks:

``prev_end`` → ``call_begin`` → ``fwd_begin`` → ``fwd_end`` → ``grads_ready`` → ``bwd_end`` → ``opt_end``

``call_begin`` is the call of the model the loop holds (DDP's wrapper); DDP's own
work before the wrapped model runs, the broadcast of buffers from rank 0 that a
model with BatchNorm makes every step, waits there for the slowest rank, and
counts as communication (``call_begin → fwd_begin``), not as input wait: with
the mark on the wrapped model alone, a rank beside a slow peer showed 91 ms of
"input wait" per step that plain DDP's loop measured as 11. Without a wrapper the
mark falls on ``fwd_begin``.

``grads_ready`` is when the last gradient bucket was handed to the all-reduce
(a DDP comm hook); ``compute_s = grads_ready − fwd_begin`` is forward plus
backward compute without the wait for peers. On CPU the marks are
``time.perf_counter()``; on CUDA each mark also records an event on the
current stream, because host time at a hook is when the kernels were *queued*,
not when they ran. Events are resolved lazily (``resolve``) at interval
boundaries, so the hot path never synchronizes. ``PhaseHooks`` sets the marks
that come from hooks.

Under FSDP2 (``trainer.sharding``) collectives run *inside* forward and
backward; on a host-blocking backend their seconds are reported through
``add_collective`` and moved from the phase they fell in to ``comm_s``, so
``compute_s`` stays local compute. On CUDA the compute stream waits for them
instead; ``add_stream_wait`` takes the two events around each wait
(``trainer.streamwaits``) and the same move is made when the events resolve.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hetero.trainer.emulation import emulate_wait

MARKS = ("prev_end", "call_begin", "fwd_begin", "fwd_end", "grads_ready", "bwd_end", "opt_end")


@dataclass(frozen=True)
class StepTimes:
    """Seconds spent in each phase of one step on one rank."""

    step: int
    batch: int
    data_s: float
    forward_s: float
    backward_s: float
    comm_s: float
    optimizer_s: float
    step_s: float
    injected_s: float = 0.0

    @property
    def compute_s(self) -> float:
        """Forward + backward until the last bucket was ready (emulated wait included)."""
        return self.forward_s + self.backward_s


class StepClock:
    """Collects the marks of each step; ``resolve`` turns finished steps into ``StepTimes``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._host: dict[str, float] = {}
        self._events: dict[str, torch.cuda.Event] = {}
        self._pending: list[
            tuple[
                int,
                int,
                dict[str, float],
                dict[str, torch.cuda.Event],
                float,
                list[float],
                list[tuple[int, torch.cuda.Event, torch.cuda.Event]],
            ]
        ] = []
        self._last_end_host = time.perf_counter()
        self._last_end_event: torch.cuda.Event | None = None
        self.injected_s = 0.0
        #: Seconds of blocking collectives in this step's forward and backward (FSDP2).
        self.collective_s = [0.0, 0.0]
        #: The compute stream's waits for collectives in this step: (phase, begin, end).
        self.stream_waits: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []

    def mark(self, name: str) -> None:
        self._host[name] = time.perf_counter()
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events[name] = ev

    def seen(self, name: str) -> bool:
        return name in self._host

    def since(self, name: str) -> float:
        """Host seconds since mark ``name`` (for the emulated slowdown)."""
        return time.perf_counter() - self._host[name]

    def compute_since(self, name: str) -> float:
        """:meth:`since` less the blocking collectives since (the step's own compute)."""
        return self.since(name) - sum(self.collective_s)

    def add_collective(self, seconds: float) -> None:
        """A blocking collective of ``seconds`` inside forward or backward (FSDP2's
        gathers and reduce-scatters); one after ``grads_ready`` is already comm time."""
        if "fwd_begin" in self._host and "grads_ready" not in self._host:
            self.collective_s["fwd_end" in self._host] += seconds

    def add_stream_wait(self, begin: torch.cuda.Event, end: torch.cuda.Event) -> None:
        """A wait of the compute stream for FSDP2's collectives between two events, inside
        forward or backward (``trainer.streamwaits``); resolved with the step's marks."""
        if "fwd_begin" in self._host and "grads_ready" not in self._host:
            self.stream_waits.append((int("fwd_end" in self._host), begin, end))

    def end_step(self, step: int, batch: int) -> None:
        """Close the step at ``opt_end``. Marks that were never hit collapse onto the next."""
        self.mark("opt_end")
        host = dict(self._host)
        host["prev_end"] = self._last_end_host
        events = dict(self._events)
        if self._last_end_event is not None:
            events["prev_end"] = self._last_end_event
        self._pending.append(
            (step, batch, host, events, self.injected_s, self.collective_s, self.stream_waits)
        )
        self._last_end_host = host["opt_end"]
        self._last_end_event = events.get("opt_end")
        self.discard()

    def discard(self) -> None:
        """Forget the marks of the step in progress (an attempt that is being retried)."""
        self._host.clear()
        self._events.clear()
        self.injected_s = 0.0
        self.collective_s = [0.0, 0.0]
        self.stream_waits = []

    def restart(self) -> None:
        """Forget the gap since the last step (after a checkpoint, an evaluation, …)."""
        self._last_end_host = time.perf_counter()
        self._last_end_event = None

    def resolve(self) -> list[StepTimes]:
        """Finished steps since the last call, as phase durations in seconds."""
        out = []
        if self.cuda and self._pending:
            ev = self._pending[-1][3].get("opt_end")
            if ev is not None:
                ev.synchronize()
        for step, batch, host, events, injected, collective, waits in self._pending:
            fwd_wait, bwd_wait = _stream_wait_s(waits, events.get("grads_ready"))
            fwd_coll, bwd_coll = collective[0] + fwd_wait, collective[1] + bwd_wait
            t = _fill(host, events, self.cuda)
            out.append(
                StepTimes(
                    step=step,
                    batch=batch,
                    # On CUDA the host waits for the GPU in many places, so host
                    # time before the forward is not input time: use the GPU's
                    # idle gap between the previous step's end and this forward.
                    data_s=max(
                        t["call_begin"] - t["prev_end"]
                        if self.cuda and "prev_end" in events
                        else host.get("call_begin", host["fwd_begin"]) - host["prev_end"],
                        0.0,
                    ),
                    forward_s=max(t["fwd_end"] - t["fwd_begin"] - fwd_coll, 0.0),
                    backward_s=max(t["grads_ready"] - t["fwd_end"] - bwd_coll, 0.0),
                    comm_s=t["bwd_end"]
                    - t["grads_ready"]
                    + max(t["fwd_begin"] - t["call_begin"], 0.0)
                    + fwd_coll
                    + bwd_coll,
                    optimizer_s=t["opt_end"] - t["bwd_end"],
                    step_s=host["opt_end"] - host["prev_end"]
                    if not self.cuda or "prev_end" not in events
                    else t["opt_end"] - t["prev_end"],
                    injected_s=injected,
                )
            )
        self._pending.clear()
        return out


def _stream_wait_s(
    waits: list[tuple[int, torch.cuda.Event, torch.cuda.Event]],
    grads_ready: torch.cuda.Event | None,
) -> tuple[float, float]:
    """Seconds the compute stream waited for collectives in forward and in backward: the
    bracketed waits, plus, after the last one in backward, the span to ``grads_ready``
    (the end of backward's waits for the last reduce-scatters)."""
    out = [0.0, 0.0]
    for phase, begin, end in waits:
        out[phase] += max(begin.elapsed_time(end), 0.0) / 1e3
    if waits and waits[-1][0] == 1 and grads_ready is not None:
        out[1] += max(waits[-1][2].elapsed_time(grads_ready), 0.0) / 1e3
    return out[0], out[1]


def _fill(
    host: dict[str, float], events: dict[str, torch.cuda.Event], cuda: bool
) -> dict[str, float]:
    """Mark times in seconds relative to ``fwd_begin``; a missing mark takes the next one's time."""
    if cuda and "fwd_begin" in events:
        base = events["fwd_begin"]
        rel = {k: base.elapsed_time(ev) / 1e3 for k, ev in events.items()}
    else:
        rel = {k: v - host.get("fwd_begin", host["opt_end"]) for k, v in host.items()}
    out: dict[str, float] = {}
    later = rel["opt_end"]
    for name in reversed(MARKS):
        later = rel.get(name, later)
        out[name] = later
    return out


class PhaseHooks:
    """The marks that come from hooks, not from the loop: ``call_begin`` from the
    wrapper's forward pre-hook (``attach_wrapper``), ``fwd_begin`` and ``fwd_end``
    from the model's forward hooks (forwards with grad enabled only), ``grads_ready``
    from the comm hook (or at the end of backward without DDP). An emulated slowdown
    (``factor()`` > 1, read at each step) waits just before ``grads_ready``, so the
    wait counts as compute."""

    def __init__(self, clock: StepClock, factor: Callable[[], float]) -> None:
        self.clock = clock
        self.factor = factor

    def attach(self, model: nn.Module) -> None:
        # First of the pre-hooks: FSDP2's root pre-forward (lazy init, the first
        # all-gather) is part of the step's forward, not of its input time.
        model.register_forward_pre_hook(self.forward_begin, prepend=True)
        model.register_forward_hook(self.forward_end)

    def attach_wrapper(self, wrapper: nn.Module) -> None:
        """``call_begin`` at the call of the wrapper around the model (DDP), before any
        of the wrapper's own work."""
        wrapper.register_forward_pre_hook(self.call_begin, prepend=True)

    def call_begin(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and not self.clock.seen("call_begin"):
            self.clock.mark("call_begin")

    def forward_begin(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and not self.clock.seen("fwd_begin"):
            self.clock.mark("fwd_begin")

    def forward_end(self, module: nn.Module, args: Any, output: Any) -> None:
        if torch.is_grad_enabled():
            self.clock.mark("fwd_end")

    def grads_ready(self) -> None:
        factor = self.factor()
        if factor > 1.0 and self.clock.seen("fwd_begin"):
            self.clock.injected_s += emulate_wait(factor, self.clock.compute_since("fwd_begin"))
        self.clock.mark("grads_ready")
