"""The rank environment is one typed value: what launchers write, ranks read back."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero.agent.orders import rank_process
from hetero.core.errors import ConfigError
from hetero.core.rankenv import JobTerms, LaunchPlan, RankEnv, term
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
        job=draw(st.one_of(st.none(), job_terms())),
    )


def job_terms() -> st.SearchStrategy[JobTerms]:
    count = st.sampled_from(["steps", "epochs"]).flatmap(
        lambda k: st.fixed_dictionaries({k: st.integers(1, 10**6)})
    )
    return count.flatmap(
        lambda c: st.builds(
            JobTerms,
            name=st.text(min_size=0, max_size=30),
            global_batch=st.integers(1, 10**6),
            policy=st.sampled_from(["dynamic", "equal", "static"]),
            rebalance_interval=st.integers(1, 1000),
            min_batch=st.integers(1, 64),
            **{k: st.just(v) for k, v in c.items()},
        )
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


def test_a_command_jobs_order_carries_the_job_files_terms_to_its_script() -> None:
    """The coordinator's order for a ``command:`` job carries the terms its script must
    keep (issue #34: a script asking for another global batch ran without hetero's plans)."""
    from hetero.core.jobspec import parse_jobspec

    spec = parse_jobspec(
        "name: mine\ncommand: [python, train.py]\nglobal_batch: 128\nsteps: 40\n"
        "policy: equal\nresources: {ranks: 2}\n"
    )
    order = pb.RankLaunch(job_id="j9", rank=0, world_size=2, device_kind=tpb.DEVICE_KIND_CPU)
    order.args.command.extend(spec.command)
    order.args.options.update(spec.launch_options())
    process = rank_process(
        order,
        python="python3",
        output_dir=Path("/tmp/out"),
        agent_endpoint="127.0.0.1:7071",
        threads=1,
        local_world_size=2,
        base={},
    )
    assert process.argv == ["python", "train.py"]
    terms = JobTerms("mine", 128, "equal", spec.rebalance_interval, 1, steps=40)
    assert process.rank_env.job == terms
    assert process.env["HETERO_JOB_NAME"] == "mine"
    assert RankEnv.from_env(process.env).job == terms
    assert "model" not in spec.launch_options()  # a script builds its own model


def test_a_script_takes_the_jobs_terms_and_is_refused_others_in_one_line() -> None:
    job = JobTerms("mine", 128, "equal", 10, steps=40)
    assert term(job, "global_batch", None, None, "ctx.loader") == 128
    assert term(job, "global_batch", 128, None, "ctx.loader") == 128
    with pytest.raises(ConfigError) as err:
        term(job, "global_batch", 256, None, "ctx.loader")
    assert str(err.value) == (
        "ctx.loader: global_batch=256, but job 'mine' says global_batch: 128 "
        "(leave it out to take the job's, or make the two agree)"
    )
    assert term(None, "policy", None, "dynamic", "ht.init") == "dynamic"
    assert term(None, "global_batch", 64, None, "ctx.loader") == 64
    with pytest.raises(ConfigError, match=r"ctx\.loader: give global_batch="):
        term(None, "global_batch", None, None, "ctx.loader")


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "x"}',
        "[1]",
        "not json",
        '{"name": "x", "global_batch": "8", "policy": "d", "rebalance_interval": 1}',
        '{"bogus": 1}',
    ],
)
def test_a_bad_job_variable_is_a_config_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError, match="HETERO_JOB="):
        RankEnv.from_env({"HETERO_JOB": text})
