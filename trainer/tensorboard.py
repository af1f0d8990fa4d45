"""``--tensorboard DIR``: per-rank scalars at every rebalance boundary.

One event file per rank under ``DIR/rank<R>`` (TensorBoard shows them as runs
side by side): loss (global and this rank's), samples/s, batch, compute and
each phase's time in seconds, peak memory in bytes, the rank's memory cap; and on
rank 0 every evaluation's metrics (``ctx.evaluate``) as ``eval/<name>`` at its step.
``tensorboard`` is an optional extra (``pip install 'hetero[tensorboard]'``),
imported only when the flag is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetero.core.errors import ConfigError
from hetero.trainer.context import Context


class TensorBoardWriter:
    """Writes this rank's interval statistics as TensorBoard scalars."""

    def __init__(self, log_dir: str | Path, rank: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "--tensorboard needs the tensorboard package: pip install 'hetero[tensorboard]'"
            ) from None
        self.rank = rank
        self._writer: Any = SummaryWriter(log_dir=str(Path(log_dir) / f"rank{rank}"))
        self._seen = 0
        self._evals = 0

    def after_step(self, ctx: Context, cap: int | None = None) -> None:
        """Write the latest interval's scalars if a new one closed at this step, and any
        evaluation recorded since the last call."""
        for record in ctx.evals[self._evals :]:
            for name, value in record["metrics"].items():
                self._writer.add_scalar(f"eval/{name}", value, record["step"])
        if len(ctx.evals) > self._evals:
            self._evals = len(ctx.evals)
            self._writer.flush()
        if len(ctx.summaries) == self._seen:
            return
        self._seen = len(ctx.summaries)
        summaries = ctx.summaries[-1]
        me = summaries[self.rank]
        wall = ctx.interval_walls[-1]
        samples = sum(s.samples for s in summaries)
        step = ctx.global_step
        scalars = {
            "loss/global": sum(s.loss_sum for s in summaries) / samples if samples else None,
            "loss/rank": me.loss_sum / me.samples if me.samples else None,
            "throughput/samples_per_s": samples / wall if wall > 0 else None,
            "plan/batch": me.batch,
            "time_s/compute": me.compute_s,
            "time_s/step": me.step_s,
            "time_s/data": me.data_s,
            "time_s/forward": me.forward_s,
            "time_s/backward": me.backward_s,
            "time_s/comm": me.comm_s,
            "time_s/optimizer": me.optimizer_s,
            "memory/peak_bytes": me.peak_memory_bytes,
            "memory/cap_samples": cap,
        }
        for tag, value in scalars.items():
            if value is not None:
                self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
