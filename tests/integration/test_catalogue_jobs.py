"""The catalogue end to end: every model through a real coordinator, the options through a
launch order to hetero-train, epochs from a dataset's real size, the origin flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from simcluster import watch_orders

from hetero import trainer as ht
from hetero.agent.orders import rank_process
from hetero.core import catalogue
from hetero.core.catalogue.commandline import build_parser, options_from_args
from hetero.core.jobspec import parse_jobspec
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

DEADLINE_S = 5.0


def _register(coordinator, devices: int = 2) -> str:  # type: ignore[no-untyped-def]
    resp = coordinator.stub.RegisterNode(
        pb.RegisterNodeRequest(
            name="box",
            address="127.0.0.1",
            devices=[
                tpb.DeviceProfile(index=i, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
                for i in range(devices)
            ],
        ),
        timeout=DEADLINE_S,
    )
    return str(resp.node_id)


def _job_yaml(model: catalogue.ModelEntry) -> str:
    """A job for ``model`` on synthetic data of its kind, with options of its kind."""
    if model.kind == "text":
        kind_options = f"seq_len: {min(16, model.max_seq_len or 16)}\noptimizer: adamw\n"
    else:
        kind_options = "channels_last: true\nimage_size: 32\noptimizer: sgd\n"
    return (
        f"name: every-model-{model.name}\nmodel: {model.name}\n"
        f"dataset: {catalogue.default_dataset(model.name)}\n{kind_options}"
        "amp: bf16\nbatch_size: 4\nepochs: 1\nnum_workers: 1\npolicy: hybrid\n"
        "resources: {ranks: 2, device: cpu}\n"
    )


@pytest.mark.parametrize("model", catalogue.MODELS, ids=lambda m: m.name)
def test_every_model_of_the_catalogue_submits_as_a_job(coordinator, tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    _register(coordinator)
    path = tmp_path / "job.yaml"
    path.write_text(_job_yaml(model))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.coordinator.cli",
            "submit",
            str(path),
            "--dry-run",
            "--json",
            "--coordinator",
            coordinator.address,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)["job"]
    assert job["global_batch"] == 8 and job["policy"] == "hybrid" and len(job["ranks"]) == 2
    assert coordinator.stub.ListJobs(pb.ListJobsRequest(), timeout=DEADLINE_S).jobs == []


def test_a_launch_order_carries_the_jobs_options_to_the_ranks_hetero_train(
    coordinator, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    node_id = _register(coordinator)
    text = (
        "name: lm\nmodel: gpt2-tiny\nseq_len: 32\namp: fp16\nactivation_checkpointing: true\n"
        "optimizer: adamw\nlr: 0.0003\nbatch_size: 6\nepochs: 2\nmax_batch: 10\n"
        "memory_margin: 0.2\neval_samples: 0\nresources: {ranks: 2, device: cpu}\n"
        "checkpoint: {dir: /tmp/lm-ckpt, interval_steps: 7}\n"
    )
    spec = parse_jobspec(text)
    coordinator.stub.SubmitJob(pb.SubmitJobRequest(spec_yaml=text), timeout=DEADLINE_S)
    orders = watch_orders(coordinator.stub, node_id).launches
    assert len(orders) == 2
    parser = build_parser("hetero-train", "", "")
    for order in orders:
        argv = rank_process(
            order,
            python="python3",
            output_dir=tmp_path / f"rank{order.rank}",
            agent_endpoint="127.0.0.1:7071",
            threads=1,
            local_world_size=2,
            base={},
        ).argv
        assert argv[:3] == ["python3", "-m", "hetero.trainer.cli"]
        got = options_from_args(parser.parse_args(argv[3:]))
        assert got.global_batch == 12 and got.epochs == 2 and got.name == "lm"
        assert got.checkpoint_every == 7 and got.device == "cpu" and got.json
        # Everything else is what the file said, by the same description.
        assert (
            got.replace(
                global_batch=None,
                batch_size=6,
                device="auto",
                output_dir=None,
                summary_json=None,
                json=False,
            )
            == spec.options
        )


def test_epochs_are_counted_from_the_datasets_real_size(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(bytes(range(256)) * 5)  # 1280 bytes: 79 windows of 16 + 1
    summary = ht.train(
        model="gpt2-tiny",
        dataset="text",
        data_dir=str(corpus),
        seq_len=16,
        epochs=3,
        global_batch=8,
        ideal_steps=0,
        eval_samples=0,
        quiet=True,
        device="cpu",
    )
    assert summary is not None
    windows = (1280 - 1) // 16
    steps_per_epoch = -(-windows // 8)  # the short last step of 7 samples is kept
    assert summary["samples_per_epoch"] == windows == 79
    assert summary["steps_per_epoch"] == steps_per_epoch == 10
    assert summary["steps"] == 3 * steps_per_epoch and summary["epochs"] == 3.0
    assert summary["epochs_requested"] == 3


@pytest.mark.slow
def test_origin_flags_batch_size_gpu_profiles_and_experiment_name(
    hetero_train, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        json.dumps(
            [
                {"name": "fast", "compute_score": 3.0, "memory_bytes": 2**30},
                {"name": "slow", "compute_score": 1.0},
            ]
        )
    )
    proc = hetero_train(
        "--model",
        "debug",
        "--nproc",
        "2",
        "--batch-size",
        "12",
        "--epochs",
        "1",
        "--num-samples",
        "96",
        "--enable-load-balancing",
        "--load-balance-policy",
        "proportional",
        "--gpu-profiles",
        str(profiles),
        "--experiment-name",
        "origin",
        "--output-dir",
        str(tmp_path / "out"),
        "--ideal-steps",
        "0",
        "--eval-samples",
        "0",
        "--quiet",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["name"] == "origin" and summary["policy"] == "proportional"
    assert summary["global_batch"] == 24 and summary["steps"] == 4  # 96 samples / 24
    assert summary["final_plan"] == [18, 6]  # 3 : 1, from the profiles file


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--global-batch", "0"], "error: --global-batch: must be >= 1, got 0"),
        (["--amp", "fp8"], "error: --amp: unknown value 'fp8' (known: none, bf16, fp16)"),
        (["--batch-size", "4", "--global-batch", "8"], "error: --batch-size: give either"),
        (["--gpu-profiles", "/nonexistent.json"], "error: --gpu-profiles: cannot read"),
        (
            ["--polcy", "equal"],
            "error: unrecognized arguments: --polcy equal (did you mean --policy?)",
        ),
    ],
)
def test_a_bad_flag_is_one_line_exit_2_no_traceback(
    hetero_train, args: list[str], line: str
) -> None:  # type: ignore[no-untyped-def]
    proc = hetero_train(
        "--model", "debug", "--steps", "1", "--ideal-steps", "0", *args, timeout_s=120
    )
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(line) and "Traceback" not in proc.stderr
