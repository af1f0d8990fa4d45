"""The compute stream's waits for FSDP2's collectives: found in this torch's FSDP2, and
moved from compute to communication by the step clock."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from hetero.trainer import streamwaits
from hetero.trainer.timing import StepClock


class _Event:
    """A CUDA event's timing surface (``elapsed_time`` in ms) at a fixed host time, so the
    clock's arithmetic can run on a CPU-only box."""

    def __init__(self, t_ms: float) -> None:
        self.t_ms = t_ms

    def elapsed_time(self, other: _Event) -> float:
        return other.t_ms - self.t_ms


@pytest.fixture
def one_rank_group(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Set for this test alone: left in the worker's environment, the rendezvous variables
    # reached the test files run after it there (and the processes they start).
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_every_unit_of_a_sharded_model_has_its_waiting_methods_bracketed(one_rank_group) -> None:  # type: ignore[no-untyped-def]
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    units = [model[0], model[2], model]
    groups = [g for m in units for g in streamwaits.param_groups(m)]
    # The root owns no parameter of its own here, so it has no group.
    assert len(groups) == 2, "this torch's FSDP2 keeps its parameter groups elsewhere"
    wrapped = streamwaits.attach(units, lambda begin, end: None)
    assert wrapped == 2 * len(streamwaits.WAITING)
    for g in groups:
        for name in streamwaits.WAITING:
            assert getattr(getattr(g, name), "_hetero_timed", False), name
    assert streamwaits.attach(units, lambda begin, end: None) == 0  # never twice


def test_a_plain_module_has_no_groups_and_attach_warns(caplog: pytest.LogCaptureFixture) -> None:
    assert streamwaits.param_groups(nn.Linear(2, 2)) == []
    assert streamwaits.attach([nn.Linear(2, 2)], lambda begin, end: None) == 0
    assert "not found" in caplog.text


def test_the_clock_moves_stream_waits_and_the_final_wait_from_compute_to_comm() -> None:
    clock = StepClock(torch.device("cpu"))
    clock.add_stream_wait(_Event(0), _Event(5))  # type: ignore[arg-type]  # before the step: ignored
    clock.mark("fwd_begin")
    clock.add_stream_wait(_Event(10), _Event(13))  # type: ignore[arg-type]  # forward: 3 ms
    clock.mark("fwd_end")
    clock.add_stream_wait(_Event(20), _Event(24))  # type: ignore[arg-type]  # backward: 4 ms
    clock.add_stream_wait(_Event(30), _Event(31))  # type: ignore[arg-type]  # backward: 1 ms
    clock._events["grads_ready"] = _Event(36)  # type: ignore[assignment]  # last wait to here: 5 ms
    clock.mark("grads_ready")
    clock.add_stream_wait(_Event(40), _Event(50))  # type: ignore[arg-type]  # after: comm already
    waits = clock.stream_waits
    assert [w[0] for w in waits] == [0, 1, 1]
    from hetero.trainer.timing import _stream_wait_s

    fwd, bwd = _stream_wait_s(waits, _Event(36))  # type: ignore[arg-type]
    assert fwd == pytest.approx(0.003)
    assert bwd == pytest.approx(0.004 + 0.001 + 0.005)
    clock.end_step(0, 8)
    assert clock.stream_waits == []
    (times,) = clock.resolve()
    assert times.comm_s >= 0.013  # 3 + 4 + 1 + 5 ms moved to communication
