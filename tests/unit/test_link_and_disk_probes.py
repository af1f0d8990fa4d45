"""The profile's node-to-node link probe, the data disk's read probe, and the
all-reduce time the planner predicts from a link."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hetero.agent.cli import main
from hetero.agent.diskprobe import measure_disk_read
from hetero.agent.peerprobe import TOKEN_DEADLINE_S, PeerLink, PeerProbeServer, measure_peer
from hetero.agent.profile import NodeProfile, with_disk_read
from hetero.core.balancer import Link, StepModel, link_comm_s, ring_all_reduce_s
from hetero.core.balancer.guard import why_not
from hetero.core.catalogue.entries import model
from hetero.core.peerlinks import TOKEN_BYTES


def test_peer_probe_measures_a_round_trip_and_both_directions_over_loopback() -> None:
    token = os.urandom(TOKEN_BYTES)
    with PeerProbeServer(token, "127.0.0.1") as server:
        link = measure_peer("node-b", "127.0.0.1", server.port, token, probe_bytes=1 << 20)
    assert link.peer == "node-b"
    assert 0 < link.rtt_s < 1.0
    assert link.send_bytes_per_s and link.receive_bytes_per_s
    assert link.bytes_per_s == min(link.send_bytes_per_s, link.receive_bytes_per_s)


def test_peer_probe_server_closes_a_connection_without_the_token_unanswered() -> None:
    with PeerProbeServer(os.urandom(TOKEN_BYTES), "127.0.0.1") as server, pytest.raises(OSError):
        measure_peer("x", "127.0.0.1", server.port, os.urandom(TOKEN_BYTES))


def test_a_stranger_trickling_bytes_cannot_hold_the_probe_from_the_ordered_peer() -> None:
    """The server answers one connection at a time: a connection that has not sent the
    whole token within TOKEN_DEADLINE_S is dropped, however slowly it keeps sending."""
    token = os.urandom(TOKEN_BYTES)
    with PeerProbeServer(token, "127.0.0.1") as server:
        stranger = socket.create_connection(("127.0.0.1", server.port))
        stop = threading.Event()

        def trickle() -> None:  # a byte every 0.5 s: each read's 10 s timeout never fires
            with contextlib.suppress(OSError):
                for _ in range(TOKEN_BYTES - 1):
                    stranger.sendall(b"x")
                    if stop.wait(0.5):
                        return

        sender = threading.Thread(target=trickle)
        sender.start()
        try:
            time.sleep(0.2)  # the stranger's connection is the one being answered
            link = measure_peer(
                "x", "127.0.0.1", server.port, token, timeout_s=TOKEN_DEADLINE_S * 3
            )
        finally:
            stop.set()
            sender.join()
            stranger.close()
    assert link.rtt_s > 0


def test_peer_probe_server_refuses_a_transfer_larger_than_its_cap() -> None:
    token = os.urandom(TOKEN_BYTES)
    with PeerProbeServer(token, "127.0.0.1", max_bytes=1024) as server, pytest.raises(OSError):
        measure_peer("x", "127.0.0.1", server.port, token, probe_bytes=1 << 20)


def test_an_unreachable_peer_is_an_oserror() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
    with pytest.raises(OSError):
        measure_peer("x", "127.0.0.1", port, os.urandom(TOKEN_BYTES), timeout_s=2.0)


def test_disk_read_probe_reports_a_rate_and_how_it_avoided_the_cache(tmp_path: Path) -> None:
    read = measure_disk_read(tmp_path, size=4 << 20)
    assert read is not None
    assert read.size == 4 << 20 and read.bytes_per_s > 0
    assert read.method in {"o_direct", "fadvise", "cached"}
    assert list(tmp_path.iterdir()) == []  # the probe's file is gone


def test_disk_read_probe_of_a_missing_directory_gives_no_figure(tmp_path: Path) -> None:
    assert measure_disk_read(tmp_path / "absent") is None


def test_profile_carries_disk_read_and_peer_links_in_its_host_message(tmp_path: Path) -> None:
    base = NodeProfile("cpu", 2, 100.0, 1 << 30, ())
    profile = replace(with_disk_read(base, tmp_path), peer_links=(PeerLink("n2", 1e-4, 1e9, None),))
    msg = profile.host_message()
    assert msg.HasField("disk_read_bytes_per_s") and msg.disk_read_bytes_per_s > 0
    assert msg.disk_read_method == profile.disk_read_method
    (link,) = msg.peer_links
    assert (link.peer, link.rtt_s, link.send_bytes_per_s) == ("n2", 1e-4, 1e9)
    assert not link.HasField("receive_bytes_per_s")
    assert not base.host_message().HasField("disk_read_bytes_per_s")


def test_ring_all_reduce_time_moves_two_w_minus_one_over_w_of_the_gradient() -> None:
    # 100 MB of gradient over a 1 GB/s link, 2 ranks: 100 MB each way = 0.1 s, + one hop.
    assert ring_all_reduce_s(100e6, 2, 1e9, 0.002) == pytest.approx(0.1 + 0.002)
    # 4 ranks: 1.5x the gradient, 6 hops of half a round trip.
    assert ring_all_reduce_s(100e6, 4, 1e9, 0.002) == pytest.approx(0.15 + 0.006)
    assert ring_all_reduce_s(100e6, 1, 1e9, 0.002) == 0.0
    with pytest.raises(ValueError):
        ring_all_reduce_s(1.0, 2, 0.0, 0.0)


def test_agent_peer_command_measures_the_link_to_a_serving_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    serve = (
        "from hetero.agent.cli import main; "
        "raise SystemExit(main(['peer', '--serve', '--listen', '127.0.0.1']))"
    )
    server = subprocess.Popen([sys.executable, "-c", serve], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline().split()  # hetero-agent peer HOST:PORT --token HEX
        assert line[:2] == ["hetero-agent", "peer"] and line[3] == "--token"
        assert main(line[1:]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"{line[2]}: rtt ") and "send " in out and "receive " in out
    finally:
        server.terminate()
    assert server.wait(timeout=10) == 0  # SIGTERM closes it as Ctrl-C does


def test_agent_peer_command_without_a_target_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["peer"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: peer: give HOST:PORT and --token")


def test_disk_read_probe_falls_back_and_says_how_the_cache_was_avoided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "O_DIRECT", raising=False)  # as on a system without it
    read = measure_disk_read(tmp_path, size=2 << 20)
    assert read is not None and read.method == "fadvise" and read.bytes_per_s > 0
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    read = measure_disk_read(tmp_path, size=2 << 20)
    assert read is not None and read.method == "cached"


def test_a_job_spanning_a_slow_link_expects_the_slowest_links_all_reduce() -> None:
    links = [Link(1e9, 0.001), Link(0.1e9, 0.0002)]  # the second is 10x slower
    # 10M fp32 parameters, 2 ranks: 40 MB through 100 MB/s, plus the longest hop.
    assert link_comm_s(10_000_000, 2, links) == pytest.approx(0.4 + 0.001)
    assert link_comm_s(10_000_000, 2, []) == 0.0  # one node: nothing measured
    assert link_comm_s(10_000_000, 1, links) == 0.0


def test_a_measured_slow_link_makes_the_planner_call_gpt2_small_communication_bound() -> None:
    # Two ranks of 0.20 and 0.28 s of work a step at batch 8, gpt2-small's gradient:
    models = [StepModel(0.02, 0.04), StepModel(0.03, 0.04)]
    parameters = model("gpt2-small").parameters
    over_lan = link_comm_s(parameters, 2, [Link(0.125e9, 0.0005)])  # 1 Gbit/s
    assert over_lan == pytest.approx(parameters * 4 / 0.125e9 + 0.0005)
    assert "communication-bound" in why_not(models, (8, 8), over_lan, alike_within=0.05)
    assert "communication-bound" not in why_not(models, (8, 8), 0.0, alike_within=0.05)
