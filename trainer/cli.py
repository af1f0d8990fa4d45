"""``hetero-train``: run a built-in job on local ranks or inside an existing job.

With ``--nproc N`` it starts N local ranks itself (Gloo on CPU, NCCL when every
rank has a GPU). Launched by torchrun or an agent (``RANK``/``WORLD_SIZE`` set),
it runs as one of those ranks. Its flags are the catalogue's training options
(``hetero.core.catalogue``), the same ones job.yaml and ``ht.train`` take.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from hetero.core import rankenv
from hetero.core.catalogue import BY_NAME, OptionError, TrainingOptions
from hetero.core.catalogue.commandline import (
    RENDEZVOUS_FLAGS,
    build_parser,
    options_from_args,
    rendezvous_from_args,
)
from hetero.core.errors import ConfigError, HeteroError, Stopped
from hetero.core.rankenv import RankEnv
from hetero.trainer import preflight, safefile, slurm

DESCRIPTION = (
    "Train a built-in model with per-rank batches sized to each rank's measured speed; the "
    "global batch and the gradient stay exactly those of plain DDP. Every flag is also a "
    "job.yaml key and an ht.train keyword, with the same default and bounds (docs/jobspec.md)."
)

EPILOG = """\
examples:
  hetero-train --nproc 3 --emulate-slowdown 1:2,2:3 --policy dynamic --steps 200
  hetero-train --model resnet50 --amp bf16 --channels-last --batch-size 64 --epochs 2
  torchrun --nproc-per-node 2 -m hetero.trainer.cli --model gpt2-small --global-batch 32
  hetero-train --nproc 2 --checkpoint-interval 50 --output-dir runs/a --resume auto

origin documents' flags, accepted as aliases (docs/trainer.md has the table):
  --batch-size B             B samples per rank: a global batch of B x ranks
  --experiment-name NAME     --name NAME
  --enable-load-balancing --load-balance-policy P   --policy P (without the switch: equal)
  --gpu-profiles FILE.json   a list, in rank order, of {name, compute_score, memory_bytes}
  --dataset synthetic_image  --dataset synthetic
  --num-epochs N             --epochs N
  --master-addr H --master-port P   MASTER_ADDR, MASTER_PORT (ranks started by hand)
  --enable-profiling --profile-interval 1   always so: every step is timed
  --num-nodes N              refused: nodes come from the launcher or the coordinator

Every output of a run with --emulate-slowdown says 'emulated': the slowdown is
an injected wait proportional to the rank's measured compute, not real hardware.
"""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("hetero-train", DESCRIPTION, EPILOG)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the options, the data and the global batch against the ranks, say what "
        "would run, and stop (nothing is trained)",
    )
    args = parser.parse_args(argv)
    dry_run = bool(vars(args).pop("dry_run", False))
    if importlib.util.find_spec("torch") is None:
        # Here, not in each rank once --nproc started them: hetero.entry turns this into
        # one line naming the extra that brings torch (hetero[train]).
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    raw_argv = argv if argv is not None else sys.argv[1:]
    try:
        cfg = options_from_args(args)
        slurm.adopt()  # a rank srun started is one of a group, as one torchrun started
        launched = RankEnv.distributed()
        _adopt_rendezvous(rendezvous_from_args(args), cfg, launched)
        if dry_run:
            return _dry_run(cfg, launched)
        if cfg.top and not launched:
            return _with_top(cfg, raw_argv)
        if cfg.simulate_nodes and not launched:
            from hetero.trainer.simulate import launch_simulated

            return launch_simulated(cfg, raw_argv)
        if cfg.nproc > 1 and not launched:
            return _launch(cfg, raw_argv)
        from hetero.trainer.job import run_job
        from hetero.trainer.report import write

        summary = run_job(cfg)
        if summary is not None:
            write(summary, _summary_path(cfg), cfg.json)
    except Stopped as exc:  # SIGTERM, the state checkpointed: the job said so in one line
        return exc.exit_code
    except OptionError as exc:  # found while running (a file, the world size): flag spelling
        return _fail(exc.spelled(_flag))
    except HeteroError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        return 130
    return 0


def _flag(name: str) -> str:
    return BY_NAME[name].flag


def _fail(exc: HeteroError) -> int:
    rank = os.environ.get(rankenv.RANK)  # read raw: this path must not fail again
    where = f"rank {rank}: " if rank not in (None, "0") else ""
    print(f"error: {where}{exc}", file=sys.stderr)
    return exc.exit_code


def _summary_path(cfg: TrainingOptions) -> str | None:
    """``--summary-json``, else ``RUN_DIR/summary.json`` for a named run."""
    if cfg.summary_json:
        return cfg.summary_json
    return str(Path(cfg.run_dir) / "summary.json") if cfg.name and cfg.run_dir else None


def _with_top(cfg: TrainingOptions, argv: list[str]) -> int:
    """This job as a child process, shown in hetero-top's run view of its directory; the
    summary goes to ``RUN_DIR/summary.json`` too, so the view ends with the final figures.

    The view is ``hetero-top --run RUN_DIR``, run as a program on this terminal beside
    the job (as a user would in a second terminal), not imported: the trainer never
    loads the TUI, and the TUI never the trainer (tests/unit/test_layering.py)."""
    assert cfg.run_dir is not None  # the catalogue's rules: --top needs a directory
    run_dir = Path(cfg.run_dir)
    child = [a for a in argv if a not in ("--top", "--no-top")]
    if not _summary_path(cfg):
        child += ["--summary-json", str(run_dir / "summary.json")]
    summary_path = Path(_summary_path(cfg) or run_dir / "summary.json")
    training = [sys.executable, "-m", "hetero.trainer.cli", *child]
    view = [sys.executable, "-m", "hetero.tui.cli", "--run", str(run_dir)]
    code = _follow(training, view, run_dir, summary_path)
    if code == 0 and summary_path.is_file() and not cfg.json:
        from hetero.trainer.report import print_summary

        print_summary(json.loads(summary_path.read_text(encoding="utf-8")))
    return code


def _follow(training: list[str], view: list[str], run_dir: Path, summary_path: Path) -> int:
    """Run ``training`` with its output in ``run_dir/train.log`` and ``view`` on this
    terminal until the user quits it; return the training's exit status. Quitting before
    the run ends stops it (SIGINT, as Ctrl-C)."""
    from hetero.trainer.metrics import run_ended

    log = run_dir / "train.log"
    with safefile.open_file(log) as out:
        child = subprocess.Popen(training, stdout=out, stderr=subprocess.STDOUT)
    stopped = False
    try:
        subprocess.run(view, check=False)
    finally:
        # A finished run's processes may still be exiting: let them; stop an unfinished one.
        finished = summary_path.is_file() or run_ended(run_dir)
        if child.poll() is None and not finished:
            stopped = True
            child.send_signal(signal.SIGINT)
        if child.poll() is None:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    code = child.returncode
    if stopped:
        print(f"hetero-train: stopped when the view closed (its output: {log})", file=sys.stderr)
        return 130
    if code != 0:
        print(f"error: hetero-train exited with status {code} (its output: {log})", file=sys.stderr)
        return code if code > 0 else 128 - code
    print(f"hetero-train: finished; its output is in {log}")
    return 0


def _adopt_rendezvous(given: dict[str, str], cfg: TrainingOptions, launched: bool) -> None:
    """``--master-addr`` / ``--master-port`` (the origin documents') as ``MASTER_ADDR`` /
    ``MASTER_PORT`` for this rank. An environment that sets either to another value (a
    launcher's) is an error, as is a flag for ``--nproc``'s ranks, which meet locally."""
    flags = {variable: flag for flag, variable in RENDEZVOUS_FLAGS.items()}
    for variable, value in given.items():
        flag = flags[variable]
        if cfg.nproc > 1 and not launched:
            raise ConfigError(
                f"{flag}: --nproc's ranks meet on this machine (127.0.0.1); give {flag} to "
                "ranks started by hand (RANK and WORLD_SIZE set) instead"
            )
        current = os.environ.get(variable)
        if current is not None and current != value:
            raise ConfigError(
                f"{flag} {value} differs from {variable}={current} in the environment"
            )
        os.environ[variable] = value


def _dry_run(cfg: TrainingOptions, launched: bool) -> int:
    """What ``--dry-run`` checks: the options against the ranks (``trainer.preflight``), then
    the model and the dataset built as each rank would build them; one line says what would
    run. A mistake is the same one line the run would print."""
    from hetero.trainer.build import build

    world = RankEnv.from_env().world_size if launched else cfg.simulate_nodes or cfg.nproc
    preflight.check(cfg, world)
    built = build(cfg)
    global_batch = cfg.global_batch_for(world)
    per_epoch = len(built.dataset) // global_batch
    steps = cfg.steps_for(per_epoch)
    ranks = f"{world} rank{'s' if world > 1 else ''}"
    emulated = f", emulated slowdown {cfg.emulate_slowdown}" if cfg.emulate_slowdown else ""
    print(
        f"dry run: {cfg.model} on {cfg.dataset} ({len(built.dataset)} samples), {ranks}, "
        f"global batch {global_batch}, {steps} steps, policy {cfg.policy}{emulated}; "
        "the options and the data check out, nothing was trained"
    )
    return 0


def _launch(cfg: TrainingOptions, argv: list[str]) -> int:
    from hetero.trainer.launch import launch_local

    # Each rank checks this too (under torchrun or an agent no launcher does): here it is
    # one line before any rank starts, not one per rank and again from the launcher.
    preflight.check(cfg, cfg.nproc)
    run_dir = cfg.run_dir
    log_dir = Path(run_dir) / "logs" if run_dir else None
    cmd = [sys.executable, "-m", "hetero.trainer.cli", *argv]
    return launch_local(cmd, cfg.nproc, log_dir=log_dir, backend=_backend_for(cfg))


def _backend_for(cfg: TrainingOptions) -> str:
    """One backend for all local ranks: NCCL only if every rank gets its own GPU."""
    if cfg.device == "cpu" or (cfg.device == "auto" and not _may_have_cuda()):
        return "gloo"  # decided without importing torch (seconds before any rank starts)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.device == "cuda" and gpus < cfg.nproc:
        raise ConfigError(
            f"--device cuda with --nproc {cfg.nproc} needs {cfg.nproc} GPUs, found {gpus}"
        )
    return "nccl" if cfg.device != "cpu" and gpus >= cfg.nproc else "gloo"


def _may_have_cuda() -> bool:
    """False only where torch cannot see a CUDA device: a CPU-only torch build, or a
    CUDA build on a Linux host whose NVIDIA driver library (``libcuda.so.1``, which
    torch's CUDA runtime loads) is absent. True otherwise: ask torch."""
    try:
        build = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return True  # torch will say what is wrong
    if build.endswith("+cpu"):
        return False
    if "rocm" in build or not sys.platform.startswith("linux"):
        return True  # HIP counts its GPUs as CUDA devices; other systems: ask torch
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
