"""Retrying a step after a rank runs out of memory, collectively, with the same samples.

The difficulty is DDP: when rank *r* raises ``torch.OutOfMemoryError`` in its
forward or backward, its peers are already inside their backward, blocked in
the all-reduce of a gradient bucket that rank *r* will never send. So the
protocol, run by :meth:`OomGuard.run` for every step, is:

1. **Attempt.** Forward and backward as usual.
2. **Drain (failed rank only).** Leave the ``except`` block (its traceback
   holds the activations), free the cache, then finish DDP's iteration so the
   peers' all-reduces complete: if the forward never returned, tell the reducer
   a backward follows (``reducer.prepare_for_backward``), then backpropagate a
   zero through every parameter whose gradient was not produced yet, with the
   comm hook's scale at 0. Buckets already sent are not sent again (their
   parameters are not in the drain graph), so every rank issues the same
   all-reduces in the same order and the reducer finishes its iteration.
3. **Vote.** One all-reduce of a ``W``-vector where each rank writes the batch
   it failed at (0 if it did not fail). Every rank learns the same outcome.
   This is the per-step price of the guard: one tiny collective and one host
   synchronization, which is why ``--oom-retry`` is opt-in.
4. **Re-plan and re-cut (only after a failure, identically on every rank).**
   Gradients are dropped (no optimizer step happened). Each failed rank's cap
   becomes ``⌊shrink × its failed batch⌋``; the step's plan is clamped to the
   caps (``round_to_plan``, a pure function of identical inputs, so no
   broadcast); the *same* global samples of the step are cut again under it
   (``HeteroLoader.redraw``); later steps use the clamped plan, and the
   planner keeps the caps. Then back to 1.

A rank that fails at ``min_batch``, caps that cannot hold the global batch,
an OOM with a single rank (its batch is the global batch), and more than
``max_retries`` attempts are one-line errors. An OOM inside
``optimizer.step()`` is outside the guard (peers may already have stepped).

Testing on CPU: ``HETERO_INJECT_OOM="RANK:STEP[:forward|backward],..."`` raises
``torch.OutOfMemoryError`` on that rank's first attempt at that global step,
from inside the model's forward or from the first parameter's gradient hook
(late in backward, after most buckets were sent).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from hetero.core.balancer import Constraints, round_to_plan
from hetero.core.errors import ConfigError, HeteroError, PlanError
from hetero.trainer.context import Context
from hetero.trainer.memory import MemoryMonitor

B = TypeVar("B")

INJECT_ENV = "HETERO_INJECT_OOM"


@dataclass(frozen=True)
class Injection:
    rank: int
    step: int
    phase: str  # "forward" or "backward"


def parse_injections(text: str | None) -> list[Injection]:
    out = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        fields = part.strip().split(":")
        try:
            rank, step = int(fields[0]), int(fields[1])
        except (ValueError, IndexError):
            raise ConfigError(f"{INJECT_ENV}: cannot parse {part!r} (RANK:STEP[:PHASE])") from None
        phase = fields[2] if len(fields) > 2 else "backward"
        if phase not in ("forward", "backward"):
            raise ConfigError(f"{INJECT_ENV}: phase must be forward or backward, got {phase!r}")
        out.append(Injection(rank, step, phase))
    return out


@dataclass(frozen=True)
class OomEvent:
    """One step that was retried: who failed at what batch, and the plan it ran under."""

    step: int
    failed: dict[int, int]  # rank -> batch it ran out of memory at
    plan: tuple[int, ...]
    injected: bool


class OomGuard:
    """Runs one step's forward and backward so that an out-of-memory error is survived."""

    def __init__(
        self,
        ctx: Context,
        model: nn.Module,
        monitor: MemoryMonitor,
        *,
        shrink: float = 0.75,
        max_retries: int = 8,
        inject: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.model = model
        self.ddp = model if isinstance(model, nn.parallel.DistributedDataParallel) else None
        self.inner: nn.Module = self.ddp.module if self.ddp is not None else model
        self.monitor = monitor
        self.shrink = shrink
        self.max_retries = max_retries
        self.events: list[OomEvent] = []
        spec = inject if inject is not None else os.environ.get(INJECT_ENV)
        self.injecting = bool(spec)  # any rank of the job injects: its retries are not real
        self._injections = [i for i in parse_injections(spec) if i.rank == ctx.rank]
        self._armed: str | None = None
        self._forward_done = False
        self.inner.register_forward_pre_hook(self._on_forward_begin)
        self.inner.register_forward_hook(self._on_forward_end)
        first = next(p for p in self.inner.parameters() if p.requires_grad)
        first.register_hook(self._on_first_param_grad)

    # -- hooks ---------------------------------------------------------------------------
    def _on_forward_begin(self, module: nn.Module, args: Any) -> None:
        self._forward_done = False
        if self._armed == "forward":
            self._armed = None
            raise torch.OutOfMemoryError(
                "injected out-of-memory error in forward (HETERO_INJECT_OOM)"
            )

    def _on_forward_end(self, module: nn.Module, args: Any, output: Any) -> None:
        self._forward_done = True

    def _on_first_param_grad(self, grad: torch.Tensor) -> None:
        if self._armed == "backward":
            self._armed = None
            raise torch.OutOfMemoryError(
                "injected out-of-memory error in backward (HETERO_INJECT_OOM)"
            )

    # -- the step ------------------------------------------------------------------------
    def run(self, batch: B, compute: Callable[[B], torch.Tensor]) -> tuple[B, torch.Tensor]:
        """``compute(batch)`` (forward and ``ctx.backward``), retried until every rank succeeds.

        Returns the batch that finally ran (re-cut after a failure) and its loss.
        """
        ctx = self.ctx
        for attempt in range(self.max_retries + 1):
            self._arm(attempt)
            failed_at = 0
            loss: torch.Tensor | None = None
            try:
                loss = compute(batch)
            except torch.OutOfMemoryError:
                failed_at = _batch_size(batch)
            # Out of the except block: the traceback and its activations are released.
            if failed_at:
                self._release()
                if ctx.world_size == 1:
                    raise HeteroError(
                        f"out of memory at step {ctx.global_step} with batch {failed_at} on the "
                        f"only rank (lower --global-batch)"
                    )
                self._drain()
            failed = self._vote(failed_at)
            if not failed:
                assert loss is not None
                return batch, loss
            batch = self._recover(failed, attempt)
        raise HeteroError(
            f"step {ctx.global_step} still ran out of memory after {self.max_retries} retries"
        )

    def _arm(self, attempt: int) -> None:
        self._armed = None
        if attempt == 0:
            for inj in self._injections:
                if inj.step == self.ctx.global_step:
                    self._armed = inj.phase

    def _release(self) -> None:
        gc.collect()
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    def _drain(self) -> None:
        """Finish DDP's iteration on the failed rank so the peers' all-reduces complete."""
        if self.ddp is None:
            return
        if not self._forward_done:
            # DDP's post-forward never ran: the reducer is not expecting a backward yet.
            self.ddp.reducer.prepare_for_backward([])
        pending = [p for p in self.inner.parameters() if p.requires_grad and p.grad is None]
        if not pending:
            return
        self.ctx.weighting.scale = 0.0
        zero = torch.stack([p.reshape(-1)[0] for p in pending]).sum() * 0.0
        zero.backward()

    def _vote(self, failed_at: int) -> dict[int, int]:
        ctx = self.ctx
        if ctx.world_size == 1:
            return {}
        votes = torch.zeros(ctx.world_size, dtype=torch.int64, device=ctx.device)
        votes[ctx.rank] = failed_at
        dist.all_reduce(votes)
        return {r: int(b) for r, b in enumerate(votes.tolist()) if b}

    def _recover(self, failed: dict[int, int], attempt: int) -> Any:
        ctx = self.ctx
        for p in self.inner.parameters():
            p.grad = None  # this attempt's gradients are partial: no optimizer step on them
        ctx.clock.discard()
        min_batch = ctx.config.min_batch
        for rank, batch in failed.items():
            if batch <= min_batch:
                raise HeteroError(
                    f"rank {rank} ran out of memory at step {ctx.global_step} even at batch "
                    f"{batch} (--min-batch {min_batch})"
                )
            self.monitor.learn(rank, max(int(batch * self.shrink), min_batch))
        loader = ctx._require_loader()
        step_plan = loader.sampler.schedule.at(ctx.global_step)
        caps = self.monitor.learned
        assert caps is not None
        try:
            constraints = Constraints(sum(step_plan), ctx.world_size, min_batch, caps)
            plan = round_to_plan([float(b) for b in step_plan], constraints)
        except PlanError as exc:
            raise HeteroError(
                f"rank(s) {sorted(failed)} ran out of memory at step {ctx.global_step} and the "
                f"others cannot take their share: {exc} (lower --global-batch)"
            ) from None
        self.monitor.update("out of memory on rank(s) " + ",".join(map(str, sorted(failed))))
        self.events.append(OomEvent(ctx.global_step, dict(failed), plan, self.injecting))
        if ctx.rank == 0:
            lost = ", ".join(f"rank {r} at batch {b}" for r, b in sorted(failed.items()))
            print(
                f"step {ctx.global_step}: out of memory on {lost}; retrying the same samples "
                f"with plan {list(plan)}",
                flush=True,
            )
        return loader.redraw(plan)


def _batch_size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(first.shape[0]) if isinstance(first, torch.Tensor) else 1
