"""The coordinator's in-memory state (``coordinator.state``): the queue's order, the
device slots placement sees, the rendezvous ports; pure, no database or gRPC."""

from __future__ import annotations

import subprocess
import sys

from hetero.coordinator import lifecycle
from hetero.coordinator.state import ClusterState, Device, Job, Node, Rank
from hetero.core.jobspec import parse_jobspec

SPEC = """\
name: j
model: simple_cnn
global_batch: 8
steps: 10
resources:
  ranks: 2
  device: cpu
"""


def _job(job_id: str, submitted: float, priority: int = 0, state: str = "QUEUED") -> Job:
    spec = parse_jobspec(SPEC, source="job.yaml")
    return Job(
        id=job_id,
        name="j",
        spec=spec,
        spec_yaml=SPEC,
        state=state,
        submitted_at_unix_s=submitted,
        world_size=2,
        priority=priority,
    )


def _node(node_id: str, name: str, heard: float, devices: int = 2) -> Node:
    return Node(
        id=node_id,
        name=name,
        address=f"{name}.local",
        agent_endpoint="",
        agent_version="",
        registered_at_unix_s=0.0,
        last_heartbeat_unix_s=heard,
        devices=tuple(Device(i, "cpu", "cpu", 1.0) for i in range(devices)),
    )


def test_the_queue_is_in_priority_then_submission_order_and_forgets_placed_jobs() -> None:
    state = ClusterState()
    for job in (_job("a", 3.0), _job("b", 1.0), _job("c", 2.0, priority=5), _job("d", 0.5)):
        state.add_job(job)
    assert [j.id for j in state.queued()] == ["c", "d", "b", "a"]
    assert state.ahead_of(state.jobs["b"]) == 2
    state.left_queue(state.jobs["d"])
    state.forget_job("a")
    assert [j.id for j in state.queued()] == ["c", "b"]
    assert [j.id for j in state.queued(limit=1)] == ["c"]


def test_device_slots_count_the_live_ranks_of_placed_jobs_and_node_health() -> None:
    state = ClusterState()
    state.add_node(_node("n1", "alpha", heard=100.0))
    state.add_node(_node("n2", "beta", heard=50.0))
    running = _job("r", 1.0, state=lifecycle.RUNNING)
    running.ranks = [
        Rank(0, "n1", 0, "cpu", "cpu", 0, lifecycle.RUNNING),
        Rank(1, "n1", 0, "cpu", "cpu", 1, lifecycle.EXITED),
    ]
    state.add_job(running)
    slots = state.device_slots(now=105.0, timeout_s=10.0, cpu_capacity=4)
    by_key = {(s.node_name, s.index): s for s in slots}
    assert by_key[("alpha", 0)].ranks_running == 1, "an exited rank holds no device"
    assert by_key[("alpha", 1)].ranks_running == 0
    assert by_key[("alpha", 0)].healthy and not by_key[("beta", 0)].healthy
    assert all(s.capacity == 4 for s in slots)
    assert state.node_named("beta") is state.find_node("n2")


def test_free_ports_skip_those_of_placed_jobs_and_rotate() -> None:
    state = ClusterState(port_cursor=1)
    held = _job("h", 1.0, state=lifecycle.RUNNING)
    held.master_port = 29502
    state.add_job(held)
    first = next(state.free_ports(29500, 4))
    second = next(state.free_ports(29500, 4))
    assert (first, second) == (29501, 29503), "29502 is held; each placement moves on"
    assert list(state.free_ports(29500, 4)) == [29500, 29501, 29503]


def test_the_state_module_needs_no_database_nor_grpc() -> None:
    code = (
        "import sys; import hetero.coordinator.state; "
        "bad = [m for m in ('sqlalchemy', 'grpc') if m in sys.modules]; "
        "sys.exit(', '.join(bad) or 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_device_slots_follow_a_node_that_registers_new_devices_and_its_drain() -> None:
    """The slots of idle devices are kept per node between passes: a new device list, a
    drain or a rank placed shows at the next call."""
    state = ClusterState()
    node = _node("n1", "alpha", heard=100.0, devices=2)
    state.add_node(node)
    assert len(state.device_slots(now=100.0, timeout_s=10.0, cpu_capacity=4)) == 2
    node.devices = tuple(Device(i, "cpu", "cpu", 1.0) for i in range(3))
    node.draining = True
    slots = state.device_slots(now=100.0, timeout_s=10.0, cpu_capacity=4)
    assert len(slots) == 3 and all(s.draining for s in slots)
    node.draining = False
    running = _job("r", 1.0, state=lifecycle.RUNNING)
    running.ranks = [Rank(0, "n1", 2, "cpu", "cpu", 0, lifecycle.RUNNING)]
    state.add_job(running)
    slots = state.device_slots(now=100.0, timeout_s=10.0, cpu_capacity=4)
    assert [(s.index, s.ranks_running, s.room, s.draining) for s in slots] == [
        (0, 0, 4, False),
        (1, 0, 4, False),
        (2, 1, 3, False),
    ]


def test_an_owners_jobs_count_the_queued_and_the_active_not_the_finished() -> None:
    state = ClusterState()
    for job_id, job_state in (
        ("q", "QUEUED"),
        ("r", lifecycle.RUNNING),
        ("f", lifecycle.SUCCEEDED),
    ):
        job = _job(job_id, 1.0, state=job_state)
        job.owner = "ann"
        state.add_job(job)
    assert state.jobs_of("ann") == 2
    state.left_queue(state.jobs["q"])
    state.jobs["q"].state = lifecycle.CANCELLED
    assert state.jobs_of("ann") == 1 and state.jobs_of("bob") == 0
    assert sorted(j.id for j in state.unqueued()) == ["f", "q", "r"]
