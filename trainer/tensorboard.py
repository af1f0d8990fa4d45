"""``tensorboard=DIR`` (``ht.init``, ``ht.train``, ``--tensorboard``): every interval's
figures as TensorBoard scalars, written by rank 0.

An ``on_interval`` callback (``trainer.intervalhooks``) on rank 0, which holds every
rank's figures after the boundary's all-gather: one writer, in one place, whatever the
ranks' hosts. TensorBoard shows each subdirectory of ``DIR`` as a run:

- ``DIR/job``: ``throughput/samples_per_s``, ``loss/global``, ``plan/changed`` (1 at a
  boundary that scheduled a new plan), ``gap/step_ms``, ``gap/reference_ms`` and
  ``gap/<term>_ms`` for each term of the interval's gap breakdown where known; and
  every evaluation's metrics (``ctx.evaluate``) as ``eval/<name>`` at its step;
- ``DIR/rank<R>``, one per rank, the same tags in each, so the ranks lie side by side:
  ``loss/rank``, ``plan/batch``, ``time_s/{compute,step,busy,data,forward,backward,comm,
  optimizer,input}``, ``memory/peak_bytes``, ``memory/cap_samples``.

Each at the step of the boundary. It uses torch's ``SummaryWriter``; the
``tensorboard`` package is an optional extra (``pip install 'hetero[tensorboard]'``),
checked on every rank when the context is made, so a missing one is one error on every
rank rather than a rank 0 that stops alone.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hetero.core.errors import ConfigError
from hetero.trainer.safefile import ensure_dir


def require_tensorboard() -> None:
    """A ``ConfigError`` naming the extra where the ``tensorboard`` package is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "tensorboard needs the tensorboard package: pip install 'hetero[tensorboard]'"
        )


class TensorBoardWriter:
    """The figures of each interval as scalars (module doc); ``evals`` is the context's
    list of evaluation records, written as they appear."""

    def __init__(self, log_dir: str | Path, evals: list[dict[str, Any]]) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self._new = SummaryWriter
        self.log_dir = Path(log_dir)
        self._writers: dict[str, Any] = {}
        self._evals = evals
        self._evals_written = 0

    def _writer(self, run: str) -> Any:
        if run not in self._writers:
            # SummaryWriter opens its files by path: the directory must be ours alone.
            self._writers[run] = self._new(log_dir=str(ensure_dir(self.log_dir / run)))
        return self._writers[run]

    def __call__(self, figures: dict[str, Any]) -> None:
        step = figures["step"]
        gap = figures["gap"] or {}
        job = {
            "throughput/samples_per_s": figures["samples_per_s"],
            "loss/global": figures["loss"],
            "plan/changed": 1.0 if figures["plan_changed"] else 0.0,
            "gap/step_ms": gap.get("step_ms"),
            "gap/reference_ms": gap.get("reference_ms"),
            **{f"gap/{t}_ms": v for t, v in (gap.get("terms_ms") or {}).items()},
        }
        self._add("job", job, step)
        for r in figures["ranks"]:
            phases = r["phases_s"]
            self._add(
                f"rank{r['rank']}",
                {
                    "loss/rank": r["local_loss"],
                    "plan/batch": r["batch"],
                    "time_s/compute": r["compute_s"],
                    "time_s/step": r["step_s"],
                    "time_s/busy": r["busy_s"],
                    **{f"time_s/{name}": phases[name] for name in phases},
                    "time_s/input": r["input_s"],
                    "memory/peak_bytes": r["peak_memory_bytes"],
                    "memory/cap_samples": r["max_batch"],
                },
                step,
            )
        self.write_evals()
        for writer in self._writers.values():
            writer.flush()

    def _add(self, run: str, scalars: dict[str, Any], step: int) -> None:
        writer = self._writer(run)
        for tag, value in scalars.items():
            if value is not None:
                writer.add_scalar(tag, value, step)

    def write_evals(self) -> None:
        """The evaluations recorded since the last call, at their steps."""
        for record in self._evals[self._evals_written :]:
            self._add("job", {f"eval/{k}": v for k, v in record["metrics"].items()}, record["step"])
        self._evals_written = len(self._evals)

    def close(self) -> None:
        self.write_evals()
        for writer in self._writers.values():
            writer.close()
