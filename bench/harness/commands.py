"""The exact command line and environment of every run of a scenario (pure, no torch).

``hetero-bench run --dry-run`` prints these; the runner executes them. Every
run is started with ``sys.executable -m …`` (never a console script), so a GPU
machine that has hetero only on ``PYTHONPATH`` runs it the same way; a ``zoo``
scenario's runs go through ``python -m torch.distributed.run`` (torchrun), as a
user launches a script. Every
environment carries the NVLink-multicast switches ``rank_env`` sets for ranks
(the neighbour is a process on a GPU too), and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
so CUDA's device indices are NVML's, which the harness samples.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hetero.bench.harness.scenariospec import BASELINE, GPU_ONLY, Neighbour, RunKey, Scenario
from hetero.bench.zoo import LOADER_PATHS

#: Set in every process the harness starts: NVLink multicast (NVLS) stays off on a shared host,
#: and CUDA numbers the GPUs as NVML does (docs/benchmarks.md, "How it runs").
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class RunSpec:
    """One process tree to start: ``argv`` with ``env`` added to the harness's environment."""

    name: str  # "ddp", "gpu-only" or a policy name; zoo runs add the data path
    runner: str  # "torch-ddp" (plain DDP), "hetero-train" or "hetero-api" (bench/zoo/train.py)
    argv: tuple[str, ...]
    env: Mapping[str, str]
    out_dir: Path
    ranks: int
    steps: int
    ideal_steps: int
    policy: str = ""  # "ddp", "gpu-only" or the hetero policy
    data_path: str = "device"
    num_workers: int = 0  # DataLoader workers per rank (0: the device path)
    repeat: int = 1  # which of the scenario's repeats (alternating pairs)

    @property
    def summary_path(self) -> Path:
        return self.out_dir / "summary.json"

    @property
    def metrics_dir(self) -> Path:
        return self.out_dir / "metrics"

    def shell(self) -> str:
        """The command as one line a person can paste into a shell."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{env} {shlex.join(self.argv)}"


def run_specs(scenario: Scenario, out_dir: Path, python: str | None = None) -> list[RunSpec]:
    """Every run of ``scenario`` in order, writing under ``out_dir/runs/<name>/``."""
    return [_spec(scenario, key, out_dir / "runs" / key.name, python) for key in scenario.runs()]


def token_file(scenario: Scenario, out_dir: Path) -> Path | None:
    """The token file a zoo language-model scenario trains on (written before the runs)."""
    if scenario.loop != "zoo" or not scenario.seq_len:
        return None
    return out_dir / "data" / "tokens.bin"


def prepare_argv(scenario: Scenario, out_dir: Path, python: str | None = None) -> tuple[str, ...]:
    """The preparation step before the runs (a zoo LM's token file), or ``()``."""
    path = token_file(scenario, out_dir)
    if path is None:
        return ()
    count = scenario.num_samples * scenario.seq_len + 1 if scenario.seq_len else 0
    return (
        python or sys.executable,
        "-m",
        "hetero.bench.zoo.tokens",
        "--out",
        str(path),
        "--tokens",
        str(count),
    )


def _zoo_spec(s: Scenario, key: RunKey, out: Path, py: str, env: dict[str, str]) -> RunSpec:
    policy, path = key.policy, key.data_path
    script = "hetero.bench.zoo.train_ddp" if policy == BASELINE else "hetero.bench.zoo.train"
    argv = [
        py,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(s.ranks),
        "-m",
        script,
        "--model",
        s.model,
        "--data",
        path,
        *(("--num-workers", str(key.num_workers)) if path in LOADER_PATHS else ()),
        "--global-batch",
        str(s.global_batch),
        "--steps",
        str(s.steps),
        "--rebalance-interval",
        str(s.rebalance_interval),
        "--lr",
        str(s.lr),
        "--amp",
        s.amp,
        "--num-classes",
        str(s.num_classes),
        "--num-samples",
        str(s.num_samples),
        "--ideal-steps",
        str(s.ideal_steps),
        "--device",
        "cpu" if s.devices == "cpu" else "cuda",
        "--output-dir",
        str(out),
        "--summary-json",
        str(out / "summary.json"),
    ]
    if s.image_size:
        argv += ["--image-size", str(s.image_size)]
    tokens = token_file(s, out.parent.parent)
    if tokens is not None:
        argv += ["--tokens", str(tokens), "--seq-len", str(s.seq_len)]
    if s.channels_last:
        argv.append("--channels-last")
    if s.emulate_spec:
        argv += ["--emulate-slowdown", s.emulate_spec]
    if path in LOADER_PATHS and s.loader_jitter:
        argv += ["--loader-jitter", s.loader_jitter]
    if path in LOADER_PATHS and s.input_cost_ms:
        argv += ["--input-cost-ms", s.input_cost_ms]
    if path == "jpeg" and s.jpeg_sides:
        argv += ["--jpeg-sides", s.jpeg_sides]
    if policy != BASELINE:
        argv += ["--policy", policy]
    runner = "torch-ddp" if policy == BASELINE else "hetero-api"
    return RunSpec(
        key.name,
        runner,
        tuple(argv),
        env,
        out,
        s.ranks,
        s.steps,
        s.ideal_steps,
        policy,
        path,
        num_workers=key.num_workers,
        repeat=key.repeat,
    )


def _spec(s: Scenario, key: RunKey, out: Path, python: str | None) -> RunSpec:
    py = python or sys.executable
    name = key.policy  # the run's kind: "ddp", "gpu-only" or a policy
    ov = s.override(name)
    steps = ov.steps or s.steps
    ideal = ov.ideal_steps if ov.ideal_steps is not None else s.ideal_steps
    ranks = 1 if name == GPU_ONLY else s.ranks
    env = dict(SAFE_ENV)
    if s.devices == "mixed":
        # The first `gpus` ranks see a GPU; later local ranks find none and run on CPU
        # (--device auto picks cuda:LOCAL_RANK only while LOCAL_RANK < device_count).
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(s.gpus))
    elif s.devices == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if s.loop == "zoo":
        return _zoo_spec(s, key, out, py, env)
    device = (
        "cpu" if s.devices == "cpu" else "cuda" if s.devices == "cuda" or ranks == 1 else "auto"
    )
    common = [
        "--model",
        s.model,
        "--global-batch",
        str(s.global_batch),
        "--steps",
        str(steps),
        "--rebalance-interval",
        str(min(s.rebalance_interval, steps)),
        "--num-classes",
        str(s.num_classes),
        "--num-samples",
        str(s.num_samples),
        "--lr",
        str(s.lr),
        "--amp",
        s.amp,
        "--ideal-steps",
        str(ideal),
        "--nproc",
        str(ranks),
        "--device",
        device,
        "--output-dir",
        str(out),
        "--summary-json",
        str(out / "summary.json"),
    ]
    if s.image_size:
        common += ["--image-size", str(s.image_size)]
    if s.dataset:
        common += ["--dataset", s.dataset]
    if s.seq_len:
        common += ["--seq-len", str(s.seq_len)]
    if s.channels_last:
        common.append("--channels-last")
    if s.devices == "mixed" and ranks > 1:
        common += ["--backend", "gloo"]
    if s.emulate_spec and ranks > 1:
        common += ["--emulate-slowdown", s.emulate_spec]
    if s.memory_fraction and ranks > 1:
        common += ["--memory-fraction", s.memory_fraction]
    if s.shard != "none" and ranks > 1:
        common += ["--shard", s.shard]
        if s.offload != "none":
            common += ["--offload", s.offload]
    if name == BASELINE:
        argv = [py, "-m", "hetero.bench.baseline_ddp", *common]
        runner = "torch-ddp"
    else:
        policy = "equal" if name == GPU_ONLY else name
        argv = [
            py,
            "-m",
            "hetero.trainer.cli",
            *common,
            "--policy",
            policy,
            "--min-batch",
            str(s.min_batch),
            "--json",
            "--quiet",
        ]
        if s.activation_checkpointing:
            argv.append("--activation-checkpointing")  # the DDP baseline does not checkpoint
        runner = "hetero-train"
    return RunSpec(
        key.name, runner, tuple(argv), env, out, ranks, steps, ideal, name, repeat=key.repeat
    )


def neighbour_stem(scenario: Scenario, n: Neighbour) -> str:
    """File stem of one neighbour's control/log/ready files in a run directory."""
    return "neighbour" if len(scenario.neighbours) == 1 else f"neighbour-gpu{n.gpu}"


def neighbour_argv(
    n: Neighbour, control: Path, log: Path, ready: Path, python: str | None = None
) -> tuple[str, ...]:
    """One noisy neighbour's command line (see ``harness.neighbour``)."""
    return (
        python or sys.executable,
        "-m",
        "hetero.bench.harness.neighbour",
        "--device",
        n.torch_device,
        "--size",
        str(n.matmul_size),
        "--duty",
        f"{n.duty:g}",
        "--control",
        str(control),
        "--log",
        str(log),
        "--ready",
        str(ready),
    )
