"""The agent's config file, flags, launch orders and one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetero.agent.config import AgentConfig, load_config, with_flags
from hetero.agent.orders import rank_process
from hetero.core.errors import ConfigError
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb


def test_file_values_are_overridden_by_flags(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("coordinator: 10.0.0.1:7070\nemulate_slowdown: 2\ncpu_threads: 4\n")
    config = with_flags(load_config(path), emulate_slowdown=3.0, cpu_threads=None)
    assert config.coordinator == "10.0.0.1:7070"
    assert config.emulate_slowdown == 3.0 and config.cpu_threads == 4


def test_a_rank_user_is_read_from_the_file_and_checked_when_the_agent_uses_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("rank_user: no-such-account-here\n")
    config = load_config(path)
    assert config.rank_user == "no-such-account-here"
    with pytest.raises(ConfigError, match="rank_user: no user 'no-such-account-here'"):
        config.rank_account()
    assert AgentConfig().rank_account() is None


def test_a_misspelled_key_names_the_line_and_the_likely_field(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("coordinator: a:1\ncpu_thread: 2\n")
    with pytest.raises(
        ConfigError, match=r"agent.yaml:2: cpu_thread: unknown field.*'cpu_threads'"
    ):
        load_config(path)


def test_invalid_values_are_rejected() -> None:
    with pytest.raises(ConfigError, match="host:port"):
        AgentConfig(coordinator="nocolon")
    with pytest.raises(ConfigError, match="emulate_slowdown"):
        AgentConfig(emulate_slowdown=0.5)


def test_cli_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.agent.cli",
            "run",
            "--coordinator",
            "nocolon",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: coordinator must be host:port, got 'nocolon'"
    ]


def test_launch_order_becomes_argv_and_env_with_the_emulated_slowdown() -> None:
    order = pb.RankLaunch(
        job_id="j1",
        rank=1,
        world_size=2,
        master_addr="10.0.0.1",
        master_port=29501,
        device_kind=tpb.DEVICE_KIND_CPU,
        emulated_slowdown=3.0,
        args=pb.TrainingArgs(
            options={
                "model": "debug",
                "global_batch": "32",
                "steps": "40",
                "policy": "dynamic",
                "rebalance_interval": "5",
                "lr": "0.1",
            }
        ),
        plan=tpb.Plan(job_id="j1", version=1, batches=[24, 8]),
    )
    process = rank_process(
        order,
        python="python3",
        output_dir=Path("/tmp/out"),
        agent_endpoint="127.0.0.1:7071",
        threads=1,
        local_world_size=1,
        base={},
    )
    argv, env = process.argv, process.env
    assert argv[argv.index("--emulate-slowdown") + 1] == "1:3"
    assert argv[argv.index("--steps") + 1] == "40" and argv[argv.index("--device") + 1] == "cpu"
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["RANK"] == "1"
    assert env["HETERO_AGENT_ENDPOINT"] == "127.0.0.1:7071" and env["HETERO_JOB_ID"] == "j1"
    assert env["HETERO_PLAN"] == "1:24,8" and env["HETERO_EMULATE_SLOWDOWN"] == "3"
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["OMP_NUM_THREADS"] == "1"
