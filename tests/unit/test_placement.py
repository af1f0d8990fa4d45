"""Placement: eligible devices, rank order, backend choice and the initial plan."""

from __future__ import annotations

import sys

import pytest

from hetero.coordinator.placement import DeviceSlot, PlacementError, place, predict
from hetero.core.jobspec import parse_jobspec


def _spec(extra: str = "", ranks: int = 2, batch: int = 96) -> object:
    return parse_jobspec(
        f"name: t\nmodel: debug\nglobal_batch: {batch}\nsteps: 10\n"
        f"resources: {{ranks: {ranks}{extra}}}\n"
    )


def _gpu(node: str, index: int, score: float = 10.0, **kw: object) -> DeviceSlot:
    return DeviceSlot(node, node, f"10.0.0.{node[-1]}", index, "cuda", "H100", score, **kw)  # type: ignore[arg-type]


def _cpu(node: str, score: float = 1.0, **kw: object) -> DeviceSlot:
    return DeviceSlot(node, node, f"10.0.0.{node[-1]}", 0, "cpu", "cpu", score, **kw)  # type: ignore[arg-type]


def test_all_cuda_ranks_use_nccl_and_rank_zero_hosts_the_rendezvous() -> None:
    p = place(_spec(), [_gpu("n2", 0), _gpu("n1", 0), _gpu("n1", 1)], master_port=29501)  # type: ignore[arg-type]
    assert p.backend == "nccl"
    assert [(r.device.node_name, r.local_rank) for r in p.ranks] == [("n1", 0), ("n1", 1)]
    assert (p.master_addr, p.master_port) == ("10.0.0.1", 29501)


def test_any_cpu_rank_makes_the_job_use_gloo_and_cuda_is_preferred() -> None:
    p = place(_spec(ranks=3), [_cpu("n1"), _gpu("n2", 0), _gpu("n2", 1)], 29500)  # type: ignore[arg-type]
    assert p.backend == "gloo"
    assert sorted(r.device.kind for r in p.ranks) == ["cpu", "cuda", "cuda"]


def test_cpu_devices_are_shared_and_cuda_devices_are_exclusive() -> None:
    p = place(_spec(ranks=3), [_cpu("n1")], 29500)  # type: ignore[arg-type]
    assert [r.local_rank for r in p.ranks] == [0, 1, 2]
    busy = [_gpu("n1", 0, ranks_running=1), _gpu("n1", 1)]
    with pytest.raises(PlacementError, match="needs 2 ranks but only 1 free CUDA devices"):
        place(_spec(", device: cuda"), busy, 29500)  # type: ignore[arg-type]


def test_unhealthy_nodes_disallowed_nodes_and_cpu_when_not_allowed_are_skipped() -> None:
    devices = [_gpu("n1", 0, healthy=False), _gpu("n2", 0), _gpu("n3", 0), _cpu("n2")]
    p = place(_spec(", nodes: [n2, n1]"), devices, 29500)  # type: ignore[arg-type]
    assert {r.device.node_name for r in p.ranks} == {"n2"} and p.backend == "gloo"
    with pytest.raises(PlacementError, match="allow_cpu is false"):
        place(_spec(", nodes: [n2], allow_cpu: false"), devices, 29500)  # type: ignore[arg-type]


def test_initial_plan_is_proportional_to_effective_speed_and_sums_to_the_global_batch() -> None:
    spec = parse_jobspec(
        "name: t\nmodel: debug\nglobal_batch: 90\nsteps: 1\nresources: {ranks: 3}\n"
        "emulate_slowdown: [1, 2, 1]\n"
    )
    p = place(spec, [_cpu("n1", 1.0), _cpu("n2", 1.0), _cpu("n3", 2.0)], 29500)
    # Scores 1, 1/2 (emulated), 2 in rank order n1, n2, n3.
    assert p.plan == (26, 13, 51) and sum(p.plan) == 90 and p.emulated


def test_predictions_show_dynamic_beating_equal_on_uneven_devices() -> None:
    spec = parse_jobspec(
        "name: t\nmodel: debug\nglobal_batch: 64\nsteps: 1\nresources: {ranks: 2}\n"
    )
    p = place(spec, [_gpu("n1", 0, 30.0), _gpu("n1", 1, 10.0)], 29500)
    by_policy = {pr.policy: pr for pr in predict(spec, p)}
    assert by_policy["equal"].batches == (32, 32)
    assert by_policy["dynamic"].batches == (48, 16)
    ratio = by_policy["dynamic"].samples_per_s / by_policy["equal"].samples_per_s
    assert ratio == pytest.approx(2.0)


def test_placement_is_pure_no_grpc_or_sqlalchemy_imported() -> None:
    assert "hetero.coordinator.placement" in sys.modules
    assert "sqlalchemy" not in sys.modules or "hetero.coordinator.models" in sys.modules


def test_a_gpu_that_cannot_hold_its_share_of_the_sharded_state_is_refused_in_one_line() -> None:
    """gpt2-small with AdamW is 1.99 GB of fp32 state: shard full over 2 ranks, 0.93 GiB each."""
    spec = parse_jobspec(
        "name: t\nmodel: gpt2-small\nshard: full\nglobal_batch: 8\nsteps: 10\n"
        "resources: {ranks: 2, device: cuda}\n"
    )
    small = [_gpu("n1", 0, memory_bytes=80 * 2**30), _gpu("n1", 1, memory_bytes=2**30)]
    with pytest.raises(PlacementError) as info:
        place(spec, small, 29500)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message and "rank 1 on n1 GPU 1" in message
    assert "0.93 GiB share of gpt2-small's training state (shard full over 2 ranks" in message
    roomy = [_gpu("n1", 0, memory_bytes=80 * 2**30), _gpu("n1", 1, memory_bytes=24 * 2**30)]
    assert len(place(spec, roomy, 29500).ranks) == 2  # type: ignore[arg-type]
    # submit --dry-run states what each rank will hold before its activations.
    from hetero.coordinator import wire

    dry = wire.dry_run_job(spec, "", place(spec, roomy, 29500))  # type: ignore[arg-type]
    assert dry.message.startswith("predicted peak memory per rank: 0.93 GiB of sharded")
    assert wire.dry_run_job(_spec(), "", place(_spec(), roomy, 29500)).message == ""  # type: ignore[arg-type]
