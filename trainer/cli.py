"""``hetero-train``: run a built-in job on local ranks or inside an existing job.

With ``--nproc N`` it starts N local ranks itself (Gloo on CPU, NCCL when every
rank has a GPU). Launched by torchrun or an agent (``RANK``/``WORLD_SIZE`` set),
it runs as one of those ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from hetero.core import rankenv
from hetero.core.balancer import POLICIES
from hetero.core.errors import ConfigError, HeteroError
from hetero.core.rankenv import RankEnv
from hetero.trainer.datasets import DATASETS
from hetero.trainer.models import MODELS
from hetero.trainer.simulate import check_args, launch_simulated

EPILOG = """\
examples:
  hetero-train --nproc 3 --emulate-slowdown 1:2,2:3 --policy dynamic --steps 200
  torchrun --nproc-per-node 2 -m hetero.trainer.cli --model resnet50 --global-batch 512
  hetero-train --nproc 2 --checkpoint-interval 50 --output-dir runs/a --resume auto

Every output of a run with --emulate-slowdown says 'emulated': the slowdown is
an injected wait proportional to the rank's measured compute, not real hardware.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hetero-train",
        description="Train a built-in model with per-rank batches sized to each rank's measured "
        "speed; the global batch and the gradient stay exactly those of plain DDP.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    job = p.add_argument_group("job")
    job.add_argument("--model", default="simple_cnn", choices=sorted(MODELS))
    job.add_argument("--dataset", default="synthetic", choices=DATASETS)
    job.add_argument(
        "--data-dir",
        help="imagefolder: its root; cifar10/cifar100: the folder holding the python batches; "
        "text: a text file or a folder of *.txt",
    )
    job.add_argument(
        "--global-batch", type=int, default=96, help="samples per step over all ranks (default 96)"
    )
    job.add_argument(
        "--steps", type=int, default=100, help="optimizer steps in total (default 100)"
    )
    job.add_argument(
        "--lr", type=float, help="learning rate (default 0.05 for SGD, 6e-4 for AdamW)"
    )
    job.add_argument("--seed", type=int, default=0)
    job.add_argument("--image-size", type=int, help="pixels per side (default: the model's)")
    job.add_argument("--num-classes", type=int, default=10)
    job.add_argument("--num-samples", type=int, default=8192, help="synthetic dataset size")
    job.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    job.add_argument(
        "--seq-len", type=int, help="tokens per sample for language models (default: the model's)"
    )
    job.add_argument("--eval-samples", type=int, default=512, help="samples scored after training")
    perf = p.add_argument_group("precision and memory")
    perf.add_argument(
        "--amp",
        default="none",
        choices=("none", "bf16", "fp16"),
        help="mixed precision: bf16 or fp16 autocast (fp16 with a gradient scaler)",
    )
    perf.add_argument("--optimizer", default="auto", choices=("auto", "sgd", "adamw"))
    perf.add_argument("--zero", action="store_true", help="shard optimizer state (ZeRO-1)")
    perf.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute transformer blocks in backward instead of storing activations",
    )
    perf.add_argument("--max-batch", metavar="N|N,N,...", help="per-rank batch caps ('-' for none)")
    perf.add_argument(
        "--no-memory-caps",
        dest="memory_caps",
        action="store_false",
        help="do not measure per-rank memory caps",
    )
    perf.add_argument(
        "--memory-margin", type=float, default=0.1, help="memory left free under a cap (0.1)"
    )
    perf.add_argument(
        "--oom-retry",
        action="store_true",
        help="survive out-of-memory errors: shrink that rank's batch and retry the step "
        "(one small all-reduce per step)",
    )
    perf.add_argument(
        "--simulate-nodes",
        type=int,
        default=0,
        help="N ranks on one GPU (Gloo), see docs/models.md",
    )
    perf.add_argument(
        "--memory-fraction",
        metavar="F|F,F,...",
        help="cap each rank's CUDA allocator at this fraction of the device",
    )
    perf.add_argument(
        "--channels-last", action="store_true", help="model and inputs in channels_last layout"
    )
    bal = p.add_argument_group("balancing")
    bal.add_argument("--policy", default="dynamic", choices=sorted(POLICIES))
    bal.add_argument(
        "--rebalance-interval", type=int, default=10, help="steps between plan exchanges"
    )
    bal.add_argument(
        "--compute-scores",
        metavar="S0,S1,...",
        help="relative speed of each rank (e.g. measured solo samples/s) for proportional/hybrid",
    )
    bal.add_argument("--min-batch", type=int, default=1, help="smallest batch any rank gets")
    bal.add_argument(
        "--emulate-slowdown",
        metavar="RANK:FACTOR[@START-END],...",
        help="make ranks slower by an injected wait (CPU only), e.g. 1:2,2:3@100-200",
    )
    run = p.add_argument_group("processes")
    run.add_argument("--nproc", type=int, default=1, help="local ranks to start (default 1)")
    run.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    run.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        help="process-group backend (default: nccl if this rank has a GPU, else gloo); "
        "a job mixing GPU and CPU ranks needs gloo",
    )
    out = p.add_argument_group("output")
    out.add_argument("--output-dir", help="metrics (JSON lines per rank), logs and checkpoints")
    out.add_argument("--summary-json", help="write the run's summary here")
    out.add_argument("--tensorboard", metavar="DIR", help="per-rank TensorBoard scalars")
    out.add_argument("--checkpoint-dir", help="default: OUTPUT_DIR/checkpoints")
    out.add_argument(
        "--checkpoint-interval", type=int, default=0, help="steps between checkpoints (0: off)"
    )
    out.add_argument(
        "--resume", metavar="PATH|auto", help="resume from a checkpoint ('auto': the last one)"
    )
    out.add_argument(
        "--ideal-steps",
        type=int,
        default=8,
        help="steps per rank for the standalone (ideal) measurement; 0 skips it",
    )
    out.add_argument(
        "--quiet", action="store_true", help="no progress lines (the summary still prints)"
    )
    out.add_argument(
        "--json", action="store_true", help="print the summary as JSON instead of a table"
    )
    return p


def config_from_args(args: argparse.Namespace) -> Any:
    from hetero.trainer.job import JobConfig

    names = {f.name for f in fields(JobConfig)}
    return JobConfig(**{k: v for k, v in vars(args).items() if k in names})


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from hetero.core.verdict import lines

    t = Table(title=f"hetero-train: {summary['policy']}", show_header=False)
    t.add_column(style="bold")
    t.add_column()

    def rate(x: float | None) -> str:
        return f"{x:,.1f} samples/s" if x else "n/a"

    amp = f", {summary['amp']}" if summary.get("amp", "none") != "none" else ""
    t.add_row(
        "model", f"{summary['model']} ({summary['world_size']} ranks, {summary['backend']}{amp})"
    )
    t.add_row("steps x global batch", f"{summary['steps']} x {summary['global_batch']}")
    t.add_row("throughput (steady)", rate(summary["steady_samples_per_s"]))
    t.add_row("throughput (whole run)", rate(summary["throughput_samples_per_s"]))
    t.add_row("ideal", rate(summary["ideal_samples_per_s"]))
    pct = summary["pct_of_ideal"]
    t.add_row("% of ideal", f"{pct:.1f}%" if pct is not None else "n/a")
    if summary.get("side_by_side_samples_per_s"):
        t.add_row(
            "ranks side by side, no sync",
            f"{rate(summary['side_by_side_samples_per_s'])} "
            f"(job reaches {summary['pct_of_side_by_side']:.1f}%)",
        )
    t.add_row("final plan", str(summary["final_plan"]))
    if any(c is not None for c in summary.get("memory_caps") or []):
        t.add_row("memory caps (samples)", summary["memory_caps_text"])
    if summary.get("oom_retries"):
        t.add_row("steps retried after OOM", str(len(summary["oom_retries"])))
    if summary.get("eval_accuracy") is not None:
        t.add_row(
            f"eval ({summary['eval_split']}, {summary['eval_samples']:.0f})",
            f"loss {summary['eval_loss']:.4f}, accuracy {100 * summary['eval_accuracy']:.1f}%",
        )
    if summary.get("simulated_nodes"):
        t.add_row("simulation", f"SIMULATED {summary['simulated_nodes']} nodes on one device")
    t.add_row("plan changes", str(summary["plan_changes"]))
    t.add_row(
        "loss first -> last",
        f"{summary['loss_first']:.4f} -> {summary['loss_last']:.4f}"
        if summary["loss_first"] is not None
        else "n/a",
    )
    if summary["emulated"]:
        t.add_row("heterogeneity", f"EMULATED ({summary['emulated_slowdown']})")
    if summary.get("gap"):
        t.add_row("where the gap went", summary["gap"]["verdict"])
    Console().print(t)
    if summary.get("gap"):
        print("\n".join(lines(summary["gap"])))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        if args.nproc < 1:
            raise ConfigError(f"--nproc must be >= 1, got {args.nproc}")
        launched = RankEnv.distributed()
        check_args(args)
        if args.simulate_nodes and not launched:
            return launch_simulated(args, argv if argv is not None else sys.argv[1:])
        if args.nproc > 1 and not launched:
            return _launch(args, argv if argv is not None else sys.argv[1:])
        from hetero.trainer.job import run_job

        summary = run_job(cfg)
    except HeteroError as exc:
        rank = os.environ.get(rankenv.RANK)  # read raw: this path must not fail again
        where = f"rank {rank}: " if rank not in (None, "0") else ""
        print(f"error: {where}{exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    if summary is not None:
        _report(summary, args)
    return 0


def _report(summary: dict[str, Any], args: argparse.Namespace) -> None:
    if args.summary_json:
        path = Path(args.summary_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)


def _launch(args: argparse.Namespace, argv: list[str]) -> int:
    from hetero.trainer.launch import launch_local

    log_dir = Path(args.output_dir) / "logs" if args.output_dir else None
    cmd = [sys.executable, "-m", "hetero.trainer.cli", *argv]
    return launch_local(cmd, args.nproc, log_dir=log_dir, backend=_backend_for(args))


def _backend_for(args: argparse.Namespace) -> str:
    """One backend for all local ranks: NCCL only if every rank gets its own GPU."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "cuda" and gpus < args.nproc:
        raise ConfigError(
            f"--device cuda with --nproc {args.nproc} needs {args.nproc} GPUs, found {gpus}"
        )
    return "nccl" if args.device != "cpu" and gpus >= args.nproc else "gloo"


def _exit_launched(code: int) -> None:
    """Leave a launched rank without interpreter teardown.

    Everything is written and flushed by now. Tearing down torch.distributed's
    C++ threads during interpreter finalization occasionally aborts a Gloo rank
    ("terminate called without an active exception"), which would turn a
    finished run into a failure; ``os._exit`` skips that teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    status = main()
    if RankEnv.launched_by_hetero() or "TORCHELASTIC_RUN_ID" in os.environ:
        _exit_launched(status)
    sys.exit(status)
