"""Store functions for nodes and their devices: registration, draining, liveness
(down and back up) and the device slots placement chooses from."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hetero.coordinator import lifecycle
from hetero.coordinator.models import DeviceRow, JobRow, NodeRow, RankRow
from hetero.coordinator.placement import DeviceSlot
from hetero.coordinator.store.events import add_event


def register_node(
    s: Session,
    *,
    name: str,
    address: str,
    agent_endpoint: str,
    agent_version: str,
    devices: Sequence[DeviceRow],
    now: float,
) -> NodeRow:
    """Create the node, or refresh it (same id, devices replaced) if the name is known."""
    node = s.scalars(select(NodeRow).where(NodeRow.name == name)).one_or_none()
    if node is None:
        node = NodeRow(id=uuid.uuid4().hex[:12], name=name, registered_at_unix_s=now)
        s.add(node)
        add_event(s, "node_registered", f"node {name} registered", node_id=node.id, now=now)
    node.address = address
    node.agent_endpoint = agent_endpoint
    node.agent_version = agent_version
    node.last_heartbeat_unix_s = now
    heard_from(s, node, now)
    node.devices.clear()
    s.flush()  # delete the old device rows before their (node, index) is reused
    node.devices.extend(devices)
    s.flush()
    return node


def heard_from(s: Session, node: NodeRow, now: float) -> None:
    if node.down:
        node.down = False
        add_event(s, "node_up", f"node {node.name} is back", node_id=node.id, now=now)


def device_slots(
    s: Session, *, now: float, timeout_s: float, cpu_capacity: int | None = None
) -> list[DeviceSlot]:
    """Every registered device with its node's health and its active ranks, for placement;
    a CPU device takes at most ``cpu_capacity`` ranks (None = no limit), a CUDA device one."""
    active = s.execute(
        select(RankRow.node_id, RankRow.device_index, func.count())
        .join(JobRow)
        # PLACED, not "not FINISHED": the index on jobs.state finds the few placed jobs
        # among thousands that ended (a queued job has no ranks).
        .where(JobRow.state.in_(lifecycle.PLACED), RankRow.state != lifecycle.EXITED)
        .group_by(RankRow.node_id, RankRow.device_index)
    )
    busy = {(node_id, index): int(n) for node_id, index, n in active}
    # Columns, not rows: the pass runs every sweep while jobs wait, and loading 1,000
    # nodes' and 4,000 devices' ORM objects cost about 250 ms of CPU each time.
    devices = s.execute(
        select(
            NodeRow.id,
            NodeRow.name,
            NodeRow.address,
            NodeRow.last_heartbeat_unix_s,
            NodeRow.draining,
            DeviceRow.index,
            DeviceRow.kind,
            DeviceRow.name,
            DeviceRow.compute_score,
            DeviceRow.memory_bytes,
            DeviceRow.emulated_slowdown,
        )
        .join(DeviceRow, DeviceRow.node_id == NodeRow.id)
        .order_by(NodeRow.name, DeviceRow.index)
    )
    return [
        DeviceSlot(
            node_id=node_id,
            node_name=node_name,
            node_address=address,
            index=index,
            kind=kind,
            name=name,
            compute_score=score,
            memory_bytes=memory,
            emulated_slowdown=slowdown,
            healthy=now - last_heartbeat <= timeout_s,  # is_healthy's rule
            draining=draining,
            ranks_running=busy.get((node_id, index), 0),
            capacity=cpu_capacity if kind == "cpu" else None,
        )
        for (
            node_id,
            node_name,
            address,
            last_heartbeat,
            draining,
            index,
            kind,
            name,
            score,
            memory,
            slowdown,
        ) in devices
    ]
