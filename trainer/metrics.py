"""A run's records under its output directory, what ``hetero-top --run`` follows.

- ``metrics/rank<R>.jsonl``: per-rank metrics as JSON lines, one record per
  interval (``interval_record``);
- ``metrics/eval.jsonl``: one record per evaluation (``Context.evaluate``), rank 0;
- ``metrics/run.json``: what the run is (``run_info``), written by rank 0 at its
  first boundary and again, with ``ended_unix_s``, when it closes.
"""

from __future__ import annotations

import io
import json
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hetero.core.slowdown import format_slowdowns
from hetero.trainer.safefile import open_file, write_text

if TYPE_CHECKING:
    from hetero.trainer.context import Context
    from hetero.trainer.exchange import RankSummary
    from hetero.trainer.gpustats import GpuReading


EVAL_FILE = "eval.jsonl"
RUN_FILE = "run.json"


class MetricsWriter:
    """Appends one JSON object per line and flushes, so a crash loses at most one record.

    Rank 0 also writes the evaluation records and the run's description.
    """

    def __init__(self, output_dir: Path | None, rank: int) -> None:
        self.path: Path | None = None
        self.rank = rank
        self._fh: TextIO | None = None
        self._run: dict[str, Any] | None = None
        if output_dir is not None:
            self.path = Path(output_dir) / "metrics" / f"rank{rank}.jsonl"
            # Opened without following a link, in a directory of ours (``trainer.safefile``).
            self._fh = io.TextIOWrapper(open_file(self.path), encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._fh.flush()

    def write_eval(self, record: dict[str, Any]) -> None:
        """Rank 0: append one evaluation record to ``metrics/eval.jsonl``."""
        if self.path is not None and self.rank == 0:
            with open_file(self.path.parent / EVAL_FILE) as fh:
                fh.write((json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8"))

    def write_run(self, info: dict[str, Any]) -> None:
        """Rank 0: (re)write ``metrics/run.json`` whole (a reader never sees half of it)."""
        if self.path is None or self.rank != 0:
            return
        self._run = info
        write_text(self.path.parent / RUN_FILE, json.dumps(info, indent=1) + "\n")

    def close(self) -> None:
        if self._run is not None and "ended_unix_s" not in self._run:
            self.write_run(self._run | {"ended_unix_s": time.time()})
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def run_ended(output_dir: Path) -> bool:
    """Whether the run in ``output_dir`` closed: its ``metrics/run.json`` has ``ended_unix_s``."""
    try:
        info = json.loads((Path(output_dir) / "metrics" / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and bool(info.get("ended_unix_s"))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of one rank's metrics file."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


#: The job's fields of a metrics record, the same in every rank's (``reason`` and
#: ``not_helping`` are rank 0's): what ``ctx.on_interval`` hands over beside the ranks'.
JOB_FIELDS = (
    "step",
    "interval_wall_s",
    "samples_per_s",
    "loss",
    "plan",
    "plan_changed",
    "next_plan",
    "apply_at_step",
    "reason",
    "not_helping",
    "comm",
    "comm_reason",
    "emulated",
)


def rank_figures(s: RankSummary) -> dict[str, Any]:
    """One rank's interval as the metrics record words it (seconds are per step, means or
    medians over the settled steps at ``batch``; ``trainer.rebalance.summarize``)."""
    return {
        "local_loss": s.loss_sum / s.samples if s.samples else None,
        "batch": s.batch,
        "steps_measured": s.steps,
        "compute_s": s.compute_s,
        "per_sample_compute_s": s.compute_s / s.batch if s.batch else None,
        "phases_s": {
            "data": s.data_s,
            "forward": s.forward_s,
            "backward": s.backward_s,
            "comm": s.comm_s,
            "optimizer": s.optimizer_s,
        },
        "step_s": s.step_s,
        # What the balancer fits (input wait + compute + optimizer), how much its
        # steps spread, and what this rank's last change of batch size cost it, in
        # seconds and in its settled steps (wall time).
        "busy_s": s.data_s + s.compute_s + s.optimizer_s,
        "busy_cv": s.busy_cv,
        "switch_s": s.switch_s,
        "switch_steps": s.switch_s / s.step_s if s.switch_s is not None and s.step_s > 0 else None,
        # What the DataLoader's workers need per batch of ``batch`` (null without them),
        # and how much their batches' seconds per sample spread.
        "input_s": s.input_s,
        "input_cv": s.input_cv,
        "peak_memory_bytes": s.peak_memory_bytes,
        "slowdown": s.slowdown,
        "injected_s": s.injected_s,
    }


def interval_record(
    ctx: Context,
    summaries: list[RankSummary],
    mine: RankSummary,
    wall_s: float,
    changed: bool,
    plan: tuple[int, ...],
    apply_at: int,
    reason: str,
    gpu: GpuReading | None = None,
) -> dict[str, Any]:
    """One metrics record: this rank's interval (``mine``) and the job's (``summaries``, one
    a plan entry: a rank, or a pipeline replica), as rank ``ctx.rank`` saw them at the
    boundary ending step ``ctx.global_step``. ``gpu``: this rank's GPU
    utilisation and memory in use over the interval, per cent (``trainer.gpustats``);
    None, or a field of it None, is ``null``: no GPU, or NVML cannot say. The caller
    adds ``comm`` and ``comm_reason``."""
    total_loss = sum(s.loss_sum for s in summaries)
    total_samples = sum(s.samples for s in summaries)
    return {
        "step": ctx.global_step,
        "rank": ctx.rank,
        "time_s": time.time(),
        "interval_wall_s": wall_s,
        "samples_per_s": total_samples / wall_s if wall_s > 0 else 0.0,
        "loss": total_loss / total_samples if total_samples else None,
        **rank_figures(mine),
        "gpu_util_percent": gpu.util_percent if gpu is not None else None,
        "gpu_memory_percent": gpu.memory_percent if gpu is not None else None,
        "plan": list(ctx._step_sizes),  # the plan that ran in this interval
        "plan_changed": changed,
        "next_plan": list(plan) if changed else None,
        "apply_at_step": apply_at if changed else None,
        "reason": reason if ctx.rank == 0 else None,
        # Why balancing does not beat equal batches here (rank 0; "" while it helps).
        "not_helping": ctx.not_helping if ctx.rank == 0 else None,
        "emulated": ctx.emulated,
    }


def run_info(ctx: Context) -> dict[str, Any]:
    """What ``hetero-top --run`` shows about the run beside its records: the job's shape,
    its emulated slowdowns and the process to look for (``host``, ``pid``)."""
    loader = ctx._require_loader()
    return {
        "policy": ctx.config.policy,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": ctx.device.type,
        "global_batch": loader.sampler.global_batch,
        "num_workers": loader.num_workers,
        "rebalance_interval": ctx.config.rebalance_interval,
        "total_steps": ctx.total_steps,
        "emulated": ctx.emulated,
        "emulated_slowdown": format_slowdowns(ctx.slowdowns) or None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started_unix_s": time.time(),
    }
