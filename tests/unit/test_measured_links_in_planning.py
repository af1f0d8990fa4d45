"""Measured node-to-node links in planning: which pairs a placed job asks to measure
(``core.peerlinks``), what the coordinator keeps of a registration's links
(``coordinator.peerlinks``), and how the all-reduce over them enters the predictions and
the first plan (``core.balancer.firstplan``, ``coordinator.placement``)."""

from __future__ import annotations

import pytest

from hetero.coordinator import peerlinks
from hetero.coordinator.placement import DeviceSlot, Placement, initial_plan, place, predict
from hetero.core.balancer import Link, StepModel, link_comm_s
from hetero.core.balancer.firstplan import comm_in_score_units, communication_bound
from hetero.core.catalogue import model
from hetero.core.jobspec import JobSpec, parse_jobspec
from hetero.core.peerlinks import FRESH_S, to_measure
from hetero.v1 import types_pb2 as tpb

NOW = 1_700_000_000.0
#: A 1 Gbit/s link with a LAN's round trip, and one a hundred times faster.
GIGABIT = Link(125e6, 0.0005)
FAST = Link(12.5e9, 0.00005)


def _pair(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


# ---- which links to measure ------------------------------------------------------------


def test_a_job_across_three_nodes_asks_each_pair_once_the_first_name_measuring() -> None:
    due = to_measure(["c", "a", "b", "a"], {"a", "b", "c"}, {}, {}, NOW)
    assert due == [("a", "b"), ("a", "c"), ("b", "c")]


def test_a_fresh_link_or_a_recent_ask_is_not_asked_again_and_a_stale_one_is() -> None:
    serving = {"a", "b", "c"}
    measured = {_pair("a", "b"): NOW - FRESH_S + 1, _pair("a", "c"): NOW - FRESH_S - 1}
    asked = {_pair("b", "c"): NOW - 10}  # no answer (a peer behind a firewall): not again
    assert to_measure("abc", serving, measured, asked, NOW) == [("a", "c")]
    assert to_measure("bc", serving, {}, {_pair("b", "c"): NOW - FRESH_S}, NOW) == [("b", "c")]


def test_a_registrations_link_of_unknown_age_is_measured() -> None:
    assert to_measure("ab", {"a", "b"}, {_pair("a", "b"): 0.0}, {}, NOW) == [("a", "b")]


def test_a_node_that_serves_no_probe_has_no_link_asked_for() -> None:
    assert to_measure("abc", {"a", "c"}, {}, {}, NOW) == [("a", "c")]
    assert to_measure("ab", {"a"}, {}, {}, NOW) == []


def test_registering_again_keeps_the_measured_links_and_takes_the_registrations_own() -> None:
    kept = tpb.PeerLink(peer="n2", rtt_s=1e-4, send_bytes_per_s=1e9, measured_at_unix_s=NOW)
    old = tpb.PeerLink(peer="n3", rtt_s=1e-4, measured_at_unix_s=NOW)
    before = tpb.HostProfile(cpu_count=2, peer_links=[kept, old])
    sent = tpb.PeerLink(peer="n3", rtt_s=2e-4, measured_at_unix_s=NOW + 99)
    after = peerlinks.registered(before, tpb.HostProfile(cpu_count=4, peer_links=[sent]))
    assert after is not None and after.cpu_count == 4
    assert [(x.peer, x.rtt_s, x.measured_at_unix_s) for x in after.peer_links] == [
        ("n2", 1e-4, NOW),
        ("n3", 2e-4, 0.0),  # a registration's time is not taken: its age is unknown
    ]
    assert peerlinks.registered(before, None) == tpb.HostProfile(peer_links=[kept, old])


# ---- the all-reduce in predictions and the first plan ---------------------------------


def _gpu(node: str, score: float) -> DeviceSlot:
    return DeviceSlot(node, node, f"10.0.0.{node[-1]}", 0, "cuda", "H100", score)


def _placed(job: str) -> tuple[JobSpec, Placement]:
    """Two nodes, one GPU each, the first 10% faster."""
    spec = parse_jobspec(job)
    return spec, place(spec, [_gpu("n1", 10.0), _gpu("n2", 9.0)], 29500)


RESNET = "name: t\nmodel: resnet18\npolicy: proportional\nglobal_batch: 64\nresources: {ranks: 2}\n"


def test_a_slow_link_makes_a_proportional_job_start_equal_and_say_why() -> None:
    spec, placed = _placed(RESNET)
    assert initial_plan(spec, placed).batches == placed.plan == (34, 30)
    first = initial_plan(spec, placed, [GIGABIT])
    assert first.batches == (32, 32) and first.policy == "proportional"
    comm = link_comm_s(model("resnet18").parameters, 2, [GIGABIT])  # 0.36 s of 44.7 MB
    assert first.reason.startswith("communication-bound: the profiles' split [34, 30] would ")
    assert (
        f"({comm * 1e3:.1f} ms/step, " in first.reason and "equal split (plain DDP)" in first.reason
    )


def test_a_fast_link_keeps_the_profiles_split() -> None:
    spec, placed = _placed(RESNET)
    first = initial_plan(spec, placed, [FAST])
    assert first.batches == (34, 30) and first.reason == "initial plan from hardware profiles"


def test_predictions_count_the_all_reduce_over_the_slowest_link() -> None:
    spec, placed = _placed(RESNET)
    alone = {p.policy: p for p in predict(spec, placed)}
    linked = {p.policy: p for p in predict(spec, placed, [FAST, GIGABIT])}
    comm = link_comm_s(model("resnet18").parameters, 2, [GIGABIT])
    assert [p.comm_s for p in linked.values()] == [pytest.approx(comm)] * 3
    assert {p.comm_s for p in alone.values()} == {0.0}
    # The compute of a step is under 2 ms at these rates: the link's 0.36 s sets it.
    gain = linked["dynamic"].samples_per_s / linked["equal"].samples_per_s
    assert gain == pytest.approx(1.0, abs=0.01)
    assert alone["dynamic"].samples_per_s / alone["equal"].samples_per_s > 1.04


def test_a_command_job_of_unknown_size_predicts_no_all_reduce() -> None:
    job = RESNET.replace("model: resnet18\n", 'command: ["python", "train.py"]\n')
    spec, placed = _placed(job)
    assert {p.comm_s for p in predict(spec, placed, [GIGABIT])} == {0.0}
    assert initial_plan(spec, placed, [GIGABIT]).batches == (34, 30)


def test_a_second_of_all_reduce_is_a_samples_flops_at_a_tflops_worth_of_score_units() -> None:
    # A sample of 1e12 FLOPs takes a second on a device of score 1 (TFLOP/s), which the
    # profile models count as 1: a second is one unit.
    assert comm_in_score_units(0.5, 1e12) == 0.5
    assert comm_in_score_units(0.5, 2e12) == 0.25
    assert comm_in_score_units(0.5, 0.0) == 0.0


def test_devices_alike_keep_their_plan_whatever_the_link() -> None:
    models = [StepModel(1.0), StepModel(1.0 / 1.005)]  # 0.5% apart: under the dead band
    assert communication_bound((33, 31), (32, 32), models, 100.0, comm_s=1.0) == ""
