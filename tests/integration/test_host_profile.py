"""A node's host profile, as its agent measured it (issue #34: the data disk's read and
the links to other nodes), is kept by the coordinator across its restart, shown by
``hetero-coord nodes``, and refused in one line when it makes no sense."""

from __future__ import annotations

import time

import grpc
import pytest

from hetero.client import render
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb
from tests.integration.conftest import Coordinator


def _register(c: Coordinator, host: tpb.HostProfile) -> None:
    device = tpb.DeviceProfile(index=0, name="cpu", kind=tpb.DEVICE_KIND_CPU, compute_score=1.0)
    request = pb.RegisterNodeRequest(name="n1", address="10.0.0.1", devices=[device], host=host)
    c.stub.RegisterNode(request, timeout=5)


def test_the_disk_read_and_links_are_kept_shown_and_survive_a_restart(
    coordinator: Coordinator,
) -> None:
    link = tpb.PeerLink(
        peer="n2", rtt_s=0.00045, send_bytes_per_s=1.2e8, receive_bytes_per_s=1.17e8
    )
    host = tpb.HostProfile(
        cpu_count=2, disk_read_bytes_per_s=1.275e9, disk_read_method="o_direct", peer_links=[link]
    )
    _register(coordinator, host)
    coordinator.restart()
    (node,) = coordinator.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes
    assert node.host_profile == host
    assert render.host_io(node.host_profile) == (
        "1,275 MB/s read (o_direct); 1 link, slowest 117 MB/s, rtt 0.45 ms"
    )


def test_the_nodes_table_gives_the_older_links_age_and_none_for_a_link_of_unknown_age() -> None:
    now = time.time()
    links = [
        tpb.PeerLink(peer="n2", rtt_s=0.0004, send_bytes_per_s=1.2e8, measured_at_unix_s=now - 60),
        tpb.PeerLink(peer="n3", rtt_s=0.0005, send_bytes_per_s=2e8, measured_at_unix_s=now - 720),
        tpb.PeerLink(peer="n4", rtt_s=0.0001, send_bytes_per_s=3e8),  # sent at registration
    ]
    assert render.host_io(tpb.HostProfile(peer_links=links)) == (
        "3 links, slowest 120 MB/s, rtt 0.50 ms, measured 12m ago"
    )


@pytest.mark.parametrize(
    ("host", "said"),
    [
        (tpb.HostProfile(disk_read_method="guessed"), "disk_read_method must be one of"),
        (
            tpb.HostProfile(disk_read_bytes_per_s=float("nan")),
            "host.disk_read_bytes_per_s: must be a finite number",
        ),
        (
            tpb.HostProfile(peer_links=[tpb.PeerLink(peer="\x1b]0;x", rtt_s=0.1)]),
            "host.peer_links[0].peer: must be one printable line",
        ),
        (
            tpb.HostProfile(peer_links=[tpb.PeerLink(peer="n2", rtt_s=-1)]),
            "host.peer_links[0].rtt_s: must be in [0,",
        ),
    ],
)
def test_a_host_profile_that_makes_no_sense_is_refused_in_one_line(
    coordinator: Coordinator, host: tpb.HostProfile, said: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _register(coordinator, host)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert said in (err.value.details() or "")
