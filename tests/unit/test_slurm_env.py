"""A rank srun started reads as torch.distributed's: host lists, ports, precedence, errors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero.core.errors import ConfigError
from hetero.core.rankenv import RankEnv
from hetero.trainer import slurm

#: What srun 22.05 gave task 1 of ``srun -n3`` on a one-node cluster (recorded, trimmed).
SRUN_TASK_1 = {
    "SLURM_JOB_ID": "1",
    "SLURM_JOB_NODELIST": "vm",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "3",
    "SLURM_PROCID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "vm",
    "SLURM_STEP_NUM_TASKS": "3",
    "SLURM_STEP_TASKS_PER_NODE": "3",
}
#: The batch script's own shell of ``sbatch -n3`` (no step: one process runs it).
BATCH_SHELL = {k: v for k, v in SRUN_TASK_1.items() if not k.startswith("SLURM_STEP")} | {
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
}


# -- host lists against a reference built from Slurm's grammar -----------------------------


@dataclass(frozen=True)
class Span:
    """``lo-hi`` (or ``lo`` alone) written with ``width`` digits."""

    lo: int
    hi: int
    width: int

    def text(self) -> str:
        lo = str(self.lo).zfill(self.width)
        return lo if self.lo == self.hi else f"{lo}-{str(self.hi).zfill(self.width)}"

    def names(self) -> list[str]:
        return [str(n).zfill(self.width) for n in range(self.lo, self.hi + 1)]


@dataclass(frozen=True)
class Expression:
    """A host expression: ``head``, then (bracket of spans, literal) pairs."""

    head: str
    groups: tuple[tuple[tuple[Span, ...], str], ...]

    def text(self) -> str:
        body = "".join(
            f"[{','.join(s.text() for s in spans)}]{tail}" for spans, tail in self.groups
        )
        return self.head + body

    def names(self) -> list[str]:
        """The reference: every combination of one number per bracket, leftmost slowest."""
        names = [self.head]
        for spans, tail in self.groups:
            numbers = [n for s in spans for n in s.names()]
            names = [f"{name}{n}{tail}" for name in names for n in numbers]
        return names


_literal = st.text("abcdefghijklmnopqrstuvwxyz0123456789-._", max_size=6)
_head = st.builds(lambda a, b: a + b, st.sampled_from("abgnrx"), _literal)


@st.composite
def spans(draw: st.DrawFn) -> Span:
    lo = draw(st.integers(0, 120))
    return Span(lo, lo + draw(st.integers(0, 5)), draw(st.integers(1, 4)))


expressions = st.builds(
    Expression,
    _head,
    st.lists(
        st.tuples(st.lists(spans(), min_size=1, max_size=3).map(tuple), _literal),
        max_size=2,
    ).map(tuple),
)


@given(st.lists(expressions, min_size=1, max_size=4))
def test_expanded_host_list_matches_the_grammars_reference(exprs: list[Expression]) -> None:
    text = ",".join(e.text() for e in exprs)
    assert slurm.expand_hostlist(text) == [n for e in exprs for n in e.names()]


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("vm", ["vm"]),
        ("node[01-03,07],gpu-a[1-2]", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a1,b2.ib", ["a1", "b2.ib"]),
    ],
)
def test_documented_host_lists_expand(text: str, hosts: list[str]) -> None:
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-", "n1]", "n[3-1]", "n[a]", "n[[1]]", "a,,b", ""])
def test_malformed_host_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="host list"):
        slurm.expand_hostlist(text)


def test_tasks_per_node_expand() -> None:
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="bad count"):
        slurm.expand_counts("2(3)")


def test_port_is_the_job_ids_last_four_digits_above_15000() -> None:
    assert slurm.port_from_job_id("1234567") == 15000 + 4567
    assert slurm.port_from_job_id("12") == 15012
    assert slurm.port_from_job_id("9999") == 24999


# -- the torch variables of a task ---------------------------------------------------------


def test_srun_task_gets_rank_world_and_rendezvous() -> None:
    assert slurm.torch_env(SRUN_TASK_1) == {
        "RANK": "1",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "3",
        "MASTER_ADDR": "vm",
        "MASTER_PORT": "15001",
    }


def test_rank_on_second_node_rendezvous_on_the_steps_first_host() -> None:
    env = SRUN_TASK_1 | {
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_JOB_NODELIST": "gpu[01,07-09]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "3",
        "SLURM_NODEID": "1",
    }
    derived = slurm.torch_env(env)
    assert derived["MASTER_ADDR"] == "gpu07"  # the step's nodes, not the job's
    assert (derived["RANK"], derived["LOCAL_WORLD_SIZE"]) == ("3", "2")


def test_task_bound_to_one_gpu_is_placed_on_it() -> None:
    bound = SRUN_TASK_1 | {"SLURM_STEP_GPUS": "4,5,6", "CUDA_VISIBLE_DEVICES": "5"}
    assert slurm.torch_env(bound)["HETERO_DEVICE"] == "cuda:0"  # not cuda:1, unseen
    assert RankEnv.from_env(bound | slurm.torch_env(bound)).cuda_index(1) == 0
    every_gpu = bound | {"CUDA_VISIBLE_DEVICES": "4,5,6"}  # cuda:LOCAL_RANK finds its own
    assert "HETERO_DEVICE" not in slurm.torch_env(every_gpu)
    set_by_hand = {k: v for k, v in bound.items() if k != "SLURM_STEP_GPUS"}
    assert "HETERO_DEVICE" not in slurm.torch_env(set_by_hand)  # no GPUs from Slurm


def test_job_node_list_serves_when_the_step_has_none() -> None:
    env = {k: v for k, v in SRUN_TASK_1.items() if k != "SLURM_STEP_NODELIST"}
    assert slurm.torch_env(env | {"SLURM_JOB_NODELIST": "c[3-4]"})["MASTER_ADDR"] == "c3"


def test_torchruns_variables_win() -> None:
    under_torchrun = SRUN_TASK_1 | {"RANK": "5", "WORLD_SIZE": "8"}
    assert slurm.torch_env(under_torchrun) == {}
    chosen = slurm.torch_env(SRUN_TASK_1 | {"MASTER_PORT": "29500", "MASTER_ADDR": "10.0.0.9"})
    assert "MASTER_PORT" not in chosen and "MASTER_ADDR" not in chosen
    assert chosen["RANK"] == "1"


def test_one_task_or_no_slurm_sets_nothing() -> None:
    assert slurm.torch_env({}) == {}
    assert slurm.torch_env(SRUN_TASK_1 | {"SLURM_NTASKS": "1"}) == {}


def test_batch_shell_with_several_tasks_fails_naming_the_step() -> None:
    with pytest.raises(ConfigError, match=r"SLURM_NTASKS=3 .*SLURM_STEP_ID.*srun") as err:
        slurm.torch_env(BATCH_SHELL)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        (("SLURM_LOCALID",), "SLURM_LOCALID"),
        (("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"), "SLURM_STEP_NODELIST"),
        (("SLURM_JOB_ID",), "SLURM_JOB_ID"),
    ],
)
def test_task_missing_a_variable_fails_naming_it(drop: tuple[str, ...], named: str) -> None:
    env = {k: v for k, v in SRUN_TASK_1.items() if k not in drop}
    with pytest.raises(ConfigError, match=f"says 3 tasks, but {named}"):
        slurm.torch_env(env)


def test_malformed_values_fail_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="SLURM_PROCID='x'"):
        slurm.torch_env(SRUN_TASK_1 | {"SLURM_PROCID": "x"})
    with pytest.raises(ConfigError, match="SLURM_STEP_NODELIST: unclosed"):
        slurm.torch_env(SRUN_TASK_1 | {"SLURM_STEP_NODELIST": "n[1-2"})
    with pytest.raises(ConfigError, match="SLURM_NODEID=4 outside"):
        slurm.torch_env(SRUN_TASK_1 | {"SLURM_NODEID": "4"})


def test_adopted_environment_reads_as_one_rank_of_the_group() -> None:
    env = dict(SRUN_TASK_1)
    slurm.adopt(env)
    rank = RankEnv.from_env(env)
    assert (rank.rank, rank.world_size, rank.local_rank, rank.local_world_size) == (1, 3, 1, 3)
    assert (rank.master_addr, rank.master_port) == ("vm", 15001)
    assert RankEnv.distributed(env)
    assert slurm.adopt(env) == {}  # a second call (hetero-train, then ht.init) changes nothing


def test_rank_bound_to_its_own_gpu_picks_nccl() -> None:
    import torch

    from hetero.trainer.bootstrap import default_backend

    # It sees one GPU while its node runs 4 ranks: each has its own, not a shared one.
    own = RankEnv(rank=1, world_size=4, local_rank=1, local_world_size=4, device="cuda:0")
    assert default_backend(torch.device("cuda", 0), own) == "nccl"
    assert default_backend(torch.device("cpu"), own) == "gloo"
