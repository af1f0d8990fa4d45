"""Under a real Slurm (a throwaway one-host cluster, ``slurmcluster.py``), ``srun -n 3`` of a
user loop and of ``hetero-train`` forms one group of 3 ranks whose losses equal those of
the same run under torchrun.

Rank 2 is emulated 3x slower, so the dynamic policy may move batches while the two runs
go: the plans of the two runs can differ, their losses cannot (the gradient of every step
is plain DDP's, whatever the plan), beyond the order in which floating-point sums add up.
The srun runs leave ``MASTER_PORT`` unset: the rendezvous is the one derived from
Slurm's variables (the step's first host, the job id's port).

Marked ``slurm``: ``make test-slurm`` (root; installs slurm-wlm and munge where missing).
Skipped in one line without root or the packages.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# beside this file (conftest puts it on sys.path)
from slurmcluster import SlurmCluster, Unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EXAMPLE = Path(__file__).parents[2] / "examples" / "custom_loop.py"
RANKS = 3
SLOWDOWN = "2:3"
#: Relative tolerance of one loss against the other run's: float32 sums in another order.
LOSS_RTOL = 1e-4
RUN_TIMEOUT_S = 300
#: The variables of the launcher that runs pytest (make test under torchrun, say): the
#: runs below must get theirs from srun or torchrun alone.
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HETERO_LAUNCHED",
    "HETERO_BACKEND",
    "OMP_NUM_THREADS",
)
HETERO_TRAIN = [
    "-m",
    "hetero.trainer.cli",
    "--model",
    "debug",
    "--num-samples",
    "192",
    "--global-batch",
    "24",
    "--steps",
    "24",
    "--rebalance-interval",
    "4",
    "--ideal-steps",
    "1",
    "--device",
    "cpu",
    "--quiet",
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    try:
        slurm = SlurmCluster()
    except Unavailable as exc:
        pytest.skip(f"no Slurm cluster here: {exc}")
    try:
        yield slurm
    finally:
        slurm.stop()


def _env(cluster: SlurmCluster) -> dict[str, str]:
    env = {k: v for k, v in cluster.env().items() if k not in LAUNCHER_VARS}
    return env | {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{' '.join(argv[:4])}: {done.stderr[-3000:]}"
    return done


def _srun(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(["srun", "-n", str(RANKS), sys.executable, *args], _env(cluster))


def _torchrun(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS)]
    # Outside the cluster's steps: no SLURM_* variable reaches these ranks.
    env = {k: v for k, v in _env(cluster).items() if not k.startswith("SLURM_")}
    return _run([*torchrun, *args], env)


def _interval_losses(run_dir: Path) -> list[float]:
    """The job's mean loss per interval, as rank 0 recorded it; every rank file there."""
    metrics = run_dir / "metrics"
    assert json.loads((metrics / "run.json").read_text())["world_size"] == RANKS
    assert sorted(p.name for p in metrics.glob("rank*.jsonl")) == [
        f"rank{r}.jsonl" for r in range(RANKS)
    ]
    lines = (metrics / "rank0.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def _assert_same_losses(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want) > 1
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert math.isclose(a, b, rel_tol=LOSS_RTOL), f"interval {i}: {a} != {b}"


def test_srun_of_a_user_loop_is_one_group_with_torchruns_losses(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    loop = [str(EXAMPLE), "--steps", "60", "--emulate-slowdown", SLOWDOWN]
    under_slurm = _srun(cluster, *loop, "--output-dir", str(tmp_path / "srun"))
    under_torchrun = _torchrun(cluster, *loop, "--output-dir", str(tmp_path / "torchrun"))
    done = [line for line in under_slurm.stdout.splitlines() if line.startswith("done:")]
    assert len(done) == 1, under_slurm.stdout  # one rank 0, not three lone trainings
    assert "(emulated slowdown)" in done[0]
    _assert_same_losses(
        _interval_losses(tmp_path / "srun"), _interval_losses(tmp_path / "torchrun")
    )
    assert "(emulated slowdown)" in under_torchrun.stdout


def test_hetero_train_under_srun_is_one_group_with_torchruns_losses(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    summaries = {}
    for name, launch in (("srun", _srun), ("torchrun", _torchrun)):
        path = tmp_path / f"{name}.json"
        launch(cluster, *HETERO_TRAIN, "--emulate-slowdown", SLOWDOWN, "--summary-json", str(path))
        summaries[name] = json.loads(path.read_text())
    srun, torchrun = summaries["srun"], summaries["torchrun"]
    assert srun["world_size"] == torchrun["world_size"] == RANKS
    assert srun["emulated"]
    _assert_same_losses(srun["interval_losses"], torchrun["interval_losses"])


def test_batch_script_without_srun_fails_in_one_line(cluster: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "train.sbatch"
    script.write_text(f"#!/bin/bash\n{sys.executable} {EXAMPLE} --steps 2\n")
    out = tmp_path / "out.txt"
    done = subprocess.run(
        ["sbatch", "--wait", "-n", str(RANKS), "-o", str(out), str(script)],
        env=_env(cluster),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode != 0
    last = out.read_text().strip().splitlines()[-1]
    assert f"SLURM_NTASKS={RANKS} but this process is not one task of an srun step" in last
    assert os.path.getsize(out) < 20_000


def test_sbatch_example_runs_one_group(cluster: SlurmCluster, tmp_path: Path) -> None:
    # As docs/deploy.md runs it: from a checkout, the virtual environment's python first
    # on PATH, `sbatch examples/slurm/train.sbatch` (here with --steps 20, passed on).
    (tmp_path / "examples" / "slurm").mkdir(parents=True)
    for name in ("custom_loop.py", "slurm/train.sbatch"):
        shutil.copy(EXAMPLE.parent / name, tmp_path / "examples" / name)
    env = _env(cluster)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        ["sbatch", "--wait", "--parsable", "examples/slurm/train.sbatch", "--steps", "20"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    job = done.stdout.strip()
    out = tmp_path / f"hetero-train-{job}.out"
    assert done.returncode == 0, out.read_text()[-3000:] if out.exists() else done.stderr
    assert [line for line in out.read_text().splitlines() if line.startswith("done:")]
    run = json.loads((tmp_path / "runs" / f"slurm-{job}" / "metrics" / "run.json").read_text())
    assert run["world_size"] == RANKS and run["emulated"]
