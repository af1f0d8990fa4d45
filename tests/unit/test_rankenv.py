"""The rank environment is one typed value: what launchers write, ranks read back."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero.agent.orders import rank_process
from hetero.core.errors import ConfigError
from hetero.core.rankenv import LaunchPlan, RankEnv
from hetero.trainer.launch import rank_env
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

_positive = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
_name = st.text("abcdefghijklmnopqrstuvwxyz0123456789.:-_/", min_size=1, max_size=20)


@st.composite
def rank_envs(draw: st.DrawFn) -> RankEnv:
    world = draw(st.integers(1, 512))
    backend = draw(st.sampled_from([None, "gloo", "nccl"]))
    device = draw(
        st.one_of(st.none(), st.just("cpu"), st.integers(0, 15).map(lambda i: f"cuda:{i}"))
    )
    plan = draw(
        st.one_of(
            st.none(),
            st.builds(
                LaunchPlan,
                st.integers(0, 10**6),
                st.lists(st.integers(0, 4096), min_size=1, max_size=8).map(tuple),
            ),
        )
    )
    return RankEnv(
        rank=draw(st.integers(0, world - 1)),
        world_size=world,
        local_rank=draw(st.integers(0, 7)),
        local_world_size=draw(st.one_of(st.none(), st.integers(1, 8))),
        master_addr=draw(st.one_of(st.none(), _name)),
        master_port=draw(st.one_of(st.none(), st.integers(1, 65535))),
        backend=backend,
        device=device,
        job_id=draw(st.one_of(st.none(), _name)),
        agent_endpoint=draw(st.one_of(st.none(), _name)),
        plan=plan,
        emulate_slowdown=draw(st.one_of(st.none(), _positive)),
        collective_timeout_s=draw(st.one_of(st.none(), _positive)),
        progress_file=draw(st.one_of(st.none(), _name.map(Path))),
        attempt=draw(st.one_of(st.none(), st.integers(0, 1000))),
        launched=draw(st.booleans()),
        threads=draw(st.one_of(st.none(), st.integers(1, 256))),
    )


@given(rank_envs())
def test_what_a_launcher_writes_a_rank_reads_back_exactly(env: RankEnv) -> None:
    assert RankEnv.from_env(env.to_env()) == env


def test_an_empty_environment_is_a_process_alone() -> None:
    env = RankEnv.from_env({})
    assert (env.rank, env.world_size, env.local_rank) == (0, 1, 0)
    assert env.plan is None and env.job_id is None and not env.launched
    assert not RankEnv.distributed({}) and RankEnv.distributed({"RANK": "0", "WORLD_SIZE": "1"})


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"RANK": "one"}, "environment variable RANK='one' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 outside WORLD_SIZE=2"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE must be >= 1, got 0"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT must be in 1..65535, got 70000"),
        ({"HETERO_BACKEND": "mpi"}, "HETERO_BACKEND must be gloo or nccl, got 'mpi'"),
        ({"HETERO_DEVICE": "tpu:0"}, "HETERO_DEVICE must be cpu or cuda:N, got 'tpu:0'"),
        ({"HETERO_PLAN": "1:a,b"}, "HETERO_PLAN='1:a,b': expected VERSION:B0,B1,..."),
        (
            {"HETERO_COLLECTIVE_TIMEOUT_S": "soon"},
            "HETERO_COLLECTIVE_TIMEOUT_S='soon' is not a number",
        ),
        ({"HETERO_COLLECTIVE_TIMEOUT_S": "0"}, "HETERO_COLLECTIVE_TIMEOUT_S must be a number > 0"),
        ({"HETERO_EMULATE_SLOWDOWN": "nan"}, "HETERO_EMULATE_SLOWDOWN must be a number > 0"),
        ({"OMP_NUM_THREADS": "0"}, "OMP_NUM_THREADS must be >= 1, got 0"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_variable(
    variables: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        RankEnv.from_env(variables)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_placed_device_wins_over_local_rank() -> None:
    # A rank placed on GPU 1 of a node whose GPU 0 is taken is local rank 0 there.
    assert RankEnv(local_rank=0, device="cuda:1").cuda_index(2) == 1
    assert RankEnv(local_rank=1, device="cpu").cuda_index(2) is None
    assert RankEnv(local_rank=1).cuda_index(2) == 1  # torchrun: cuda:LOCAL_RANK
    assert RankEnv(local_rank=2).cuda_index(2) is None  # no third GPU: the CPU
    assert RankEnv(device="cuda:3").cuda_index(2) is None


def test_nccl_ranks_end_on_a_failed_collective_and_no_rank_uses_nvlink_multicast() -> None:
    nccl = RankEnv(backend="nccl").to_env()
    assert nccl["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and nccl["NCCL_NVLS_ENABLE"] == "0"
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in RankEnv(backend="gloo").to_env()


def test_the_agent_makes_the_ranks_environment_from_the_orders_fields() -> None:
    order = pb.RankLaunch(
        job_id="j1",
        rank=1,
        world_size=2,
        master_addr="10.0.0.1",
        master_port=29501,
        backend="gloo",
        device_kind=tpb.DEVICE_KIND_CPU,
        emulated_slowdown=3.0,
        collective_timeout_s=60.0,
        attempt=2,
        plan=tpb.Plan(job_id="j1", version=4, batches=[24, 8]),
    )
    process = rank_process(
        order,
        python="python3",
        output_dir=Path("/tmp/out"),
        agent_endpoint="127.0.0.1:7071",
        threads=2,
        local_world_size=1,
        base={},
    )
    env = process.rank_env
    assert env.master_addr == "10.0.0.1" and env.attempt == 2 and env.device == "cpu"
    assert env.plan == LaunchPlan(4, (24, 8)) and env.agent_endpoint == "127.0.0.1:7071"
    assert env.threads == 2 and env.local_world_size == 1 and env.launched
    assert env.job_id == "j1" and env.backend == "gloo" and env.emulate_slowdown == 3.0
    assert RankEnv.from_env(process.env) == env
    assert process.env["HETERO_COLLECTIVE_TIMEOUT_S"] == "60"


def test_local_ranks_get_the_same_type() -> None:
    env = RankEnv.from_env(rank_env(1, 3, 29600, threads=2, backend="gloo", base={}))
    assert env == RankEnv(
        rank=1,
        world_size=3,
        local_rank=1,
        local_world_size=3,
        master_addr="127.0.0.1",
        master_port=29600,
        backend="gloo",
        threads=2,
        launched=True,
    )
