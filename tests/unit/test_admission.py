"""The admission rules as pure functions: queue order, held devices, the pass's early
stop, the reason a job waits, the jobs that can never fit, the limits."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from hetero.coordinator import admission
from hetero.coordinator.admission import AdmissionError, Limits, Waiting, admit, check_fits
from hetero.coordinator.placement import DeviceSlot, PlacementError
from hetero.core.errors import ConfigError
from hetero.core.jobspec import JobSpec, parse_jobspec


def cpu(node: str, running: int = 0, capacity: int = 2, **kw: object) -> DeviceSlot:
    return DeviceSlot(
        node,
        node,
        f"{node}.local",
        0,
        "cpu",
        "cpu",
        1.0,
        ranks_running=running,
        capacity=capacity,
        **kw,  # type: ignore[arg-type]
    )


def gpu(node: str, index: int, running: int = 0) -> DeviceSlot:
    return DeviceSlot(
        node, node, f"{node}.local", index, "cuda", "H100", 100.0, ranks_running=running
    )


def spec(name: str, ranks: int, device: str = "cpu", nodes: str = "") -> JobSpec:
    where = f"\n  nodes: [{nodes}]" if nodes else ""
    return parse_jobspec(
        f"name: {name}\nglobal_batch: 32\nresources:\n  ranks: {ranks}\n  device: {device}{where}\n"
    )


def waiting(*specs: JobSpec) -> list[Waiting]:
    return [Waiting(s.name, lambda s=s: s) for s in specs]


def ports() -> Iterator[int]:
    return itertools.count(29500)


def test_jobs_that_fit_are_placed_in_order_each_with_its_own_port() -> None:
    decisions = admit(waiting(spec("a", 1), spec("b", 2), spec("c", 1)), [cpu("n1")], ports())
    placed = [d for d in decisions if d.placement is not None]
    assert [d.job_id for d in placed] == ["a"], "b needs 2 slots, 1 left: it waits"
    assert decisions[1].job_id == "b" and decisions[1].placement is None
    assert decisions[1].reason == "waiting for 2 CPU slots; 1 free on n1"
    # c fits in the slot left, but b ahead of it waits for that device: c may not take it.
    assert decisions[2].placement is None
    assert decisions[2].reason == (
        "waiting for 1 CPU slot; none free; 1 held for jobs ahead in the queue"
    )

    two = admit(waiting(spec("a", 1), spec("c", 1)), [cpu("n1")], ports())
    assert [d.placement.master_port for d in two if d.placement] == [29500, 29501]


def test_a_waiting_job_holds_only_the_devices_it_may_use() -> None:
    devices = [cpu("n1", running=2), cpu("n2")]
    queue = waiting(spec("big", 2, nodes="n1"), spec("other", 1, nodes="n2"), spec("any", 1))
    decisions = {d.job_id: d for d in admit(queue, devices, ports())}
    assert decisions["big"].placement is None
    assert decisions["big"].reason == "waiting for 2 CPU slots; none free"
    assert decisions["other"].placement is not None, "another node: it goes ahead"
    assert decisions["other"].placement.ranks[0].device.node_name == "n2"
    # "any" may use n1 (held for big) and n2, where one slot is left after "other".
    assert decisions["any"].placement is not None
    assert decisions["any"].placement.ranks[0].device.node_name == "n2"


def test_the_pass_stops_once_nothing_has_room() -> None:
    def never() -> JobSpec:
        raise AssertionError("the pass read a spec behind the first that cannot start")

    queue = [*waiting(spec("a", 2), spec("b", 1)), Waiting("x", never), Waiting("y", never)]
    decisions = admit(queue, [cpu("n1")], ports())
    assert [d.job_id for d in decisions] == ["a", "b"]
    assert decisions[1].reason == "waiting for 1 CPU slot; none free"


def test_no_free_rendezvous_port_keeps_the_job_waiting() -> None:
    decisions = admit(waiting(spec("a", 1), spec("b", 1)), [cpu("n1")], iter([29500]))
    assert decisions[0].placement is not None and decisions[0].placement.master_port == 29500
    assert decisions[1].placement is None and "rendezvous port" in decisions[1].reason


def test_the_reason_names_held_drained_and_down_devices() -> None:
    devices = [cpu("n1"), cpu("n2", draining=True), cpu("n3", healthy=False)]
    text = admission.reason(spec("j", 6), devices, held={("n1", 0)})
    assert text == (
        "waiting for 6 CPU slots; none free; 2 held for jobs ahead in the queue; "
        "drained: n2; down: n3"
    )
    text = admission.reason(
        spec("g", 2, device="cuda"), [gpu("g", 0, running=1), gpu("g", 1)], set()
    )
    assert text == "waiting for 2 CUDA devices; 1 free on g"


def test_a_job_that_could_never_run_is_refused_and_busy_or_drained_devices_do_not_count() -> None:
    busy = [cpu("n1", running=2, draining=True), cpu("n2", healthy=False)]
    check_fits(spec("fits", 4), busy)  # 2 devices x 2 slots, once idle: it may wait
    with pytest.raises(PlacementError) as info:
        check_fits(spec("huge", 5), busy)
    assert str(info.value) == (
        "job 'huge' needs 5 ranks, more than the 2 registered CPU devices can ever hold "
        "(4 at 2 ranks each (ranks_per_cpu_device)): it would wait for ever"
    )
    with pytest.raises(PlacementError, match="the 1 registered CPU devices of nodes n1"):
        check_fits(spec("pinned", 3, nodes="n1"), busy)
    with pytest.raises(PlacementError, match="the 0 registered CUDA devices"):
        check_fits(spec("gpus", 1, device="cuda"), busy)
    check_fits(spec("gpus", 2, device="cuda"), [gpu("g", 0, running=1), gpu("g", 1)])


def test_limits_are_checked_in_one_line_each() -> None:
    limits = Limits(jobs_per_user=2, max_spec_bytes=2048)
    admission.check_jobs_per_user("user token", 1, limits)
    with pytest.raises(AdmissionError) as info:
        admission.check_jobs_per_user("user token", 2, limits)
    assert info.value.grpc_code == "RESOURCE_EXHAUSTED"
    assert str(info.value).startswith("user token has 2 queued or active jobs, the coordinator's")
    admission.check_spec_bytes("x" * 2048, limits)
    with pytest.raises(
        AdmissionError, match="job spec is 2,049 bytes, over the coordinator's limit of 2,048"
    ):
        admission.check_spec_bytes("x" * 2049, limits)
    with pytest.raises(ConfigError, match="ranks_per_cpu_device must be >= 1"):
        Limits(ranks_per_cpu_device=0)
    with pytest.raises(ConfigError, match="max_spec_bytes"):
        Limits(max_spec_bytes=2 << 20)


def test_a_reason_names_three_nodes_and_counts_the_rest() -> None:
    """On a cluster of a thousand nodes a job's message stays one short line (it listed
    every node with a free device: 12 KB a job on 1,000 nodes)."""
    devices = [gpu(f"n{i:03d}", 0) for i in range(30)]
    text = admission.reason(spec("big", 31, device="cuda"), devices, set())
    assert text == "waiting for 31 CUDA devices; 30 free on n000, n001, n002 and 27 more nodes"


def test_a_job_wanting_more_than_the_free_room_waits_and_holds_what_it_may_use() -> None:
    devices = [gpu("g", 0), gpu("g", 1), cpu("c")]
    decisions = admit(
        waiting(spec("big", 3, device="cuda"), spec("small", 1, device="cuda"), spec("c", 1)),
        devices,
        ports(),
    )
    assert [(d.job_id, d.placement is not None) for d in decisions] == [
        ("big", False),
        ("small", False),
        ("c", True),
    ], "the GPUs are held for the head; the CPU job behind takes the CPU device"
    assert decisions[0].reason == "waiting for 3 CUDA devices; 2 free on g"
