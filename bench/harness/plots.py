"""PNG plots of a scenario run. matplotlib is optional (``pip install 'hetero[bench]'``).

Imported lazily: ``hetero-bench run`` works without it (the GPU machine has
none) and ``hetero-bench report DIR`` draws the plots later, elsewhere, from
the fetched metrics. Three figures:

- ``throughput.png``: job samples/s per interval, one line per run;
- ``batches.png``: each rank's batch per interval, one panel per run;
- ``compute.png``: each rank's compute-only seconds per step, one panel per run
  (plain DDP reports none: its panel shows per-step wall seconds instead).

Change steps (neighbour arrival and departure, emulated windows) are dashed
vertical lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hetero.bench.harness.results import RunData


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw(
    out_dir: Path, runs: Sequence[RunData], changes: Sequence[tuple[int, str]], title: str
) -> list[Path]:
    """Write the three PNGs into ``out_dir``; return their paths ([] without matplotlib)."""
    if not matplotlib_available():
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in runs if r.rank0]
    if not runs:
        return []
    paths = []

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for run in runs:
        ax.plot(run.steps, run.rates, marker=".", label=run.name)
    _changes(ax, changes)
    ax.set_xlabel("step")
    ax.set_ylabel("samples/s (job, per interval)")
    ax.set_title(f"{title}: throughput")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out_dir / "throughput.png"))

    for fname, what, ylabel in (
        ("batches.png", "batch", "batch (samples)"),
        ("compute.png", "compute_s", "compute s/step"),
    ):
        fig, axes = plt.subplots(
            len(runs), 1, figsize=(9, 2.2 * len(runs) + 0.8), sharex=True, squeeze=False
        )
        for ax, run in zip(axes[:, 0], runs, strict=True):
            for rank, recs in enumerate(run.ranks):
                key = what
                if what == "compute_s" and recs and recs[0].get("compute_s") is None:
                    key = "step_s"  # plain DDP: wall per step, comm included
                xs = [int(r["step"]) for r in recs if r.get(key) is not None]
                ys = [float(r[key]) for r in recs if r.get(key) is not None]
                ax.plot(xs, ys, marker=".", label=f"rank {rank}")
            _changes(ax, changes)
            note = (
                " (wall s/step: no compute-only time)"
                if what == "compute_s" and run.runner_is_ddp
                else ""
            )
            ax.set_title(f"{run.name}{note}", fontsize=9)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[-1, 0].set_xlabel("step")
        fig.suptitle(f"{title}: {what.replace('_s', ' time')} per rank")
        paths.append(_save(fig, out_dir / fname))
    return paths


def _changes(ax: Any, changes: Sequence[tuple[int, str]]) -> None:
    for step, _label in changes:
        ax.axvline(step, linestyle="--", color="grey", linewidth=0.8)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
