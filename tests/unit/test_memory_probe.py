"""The start-up memory probe: the caps its two points give, the optimizer state it adds,
and a probe that leaves the model, its buffers and the RNG streams as they were."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetero.core.errors import ConfigError, HeteroError, PlanError
from hetero.core.memfit import (
    GIB,
    ProbedRank,
    probe_caps,
    probe_fit,
    probe_line_bends,
    probe_pass_fits,
    sharded_state_bytes,
)
from hetero.trainer.memprobe import (
    INJECT_ENV,
    optimizer_state_bytes,
    parse_injection,
    probe,
    probe_memory,
)
from hetero.trainer.start import init

MIB = 2**20
#: gpt2-medium's parameters (the catalogue's count).
GPT2_MEDIUM = 354_823_168


def _probed(rank: int, budget: float, fixed: float, per_sample: float, optimizer: float):
    fit = probe_fit([(1, int(fixed + per_sample)), (2, int(fixed + 2 * per_sample))])
    assert fit is not None
    return ProbedRank(rank, f"cuda:{rank}", fit, optimizer, budget)


def test_a_small_device_gets_the_batch_its_memory_holds_from_the_first_plan() -> None:
    """gpt2-medium sharded over 2 GPUs, one capped to 8% of 80 GiB: parameters and gradients
    (8 bytes per parameter, halved) are in the probe's peaks, AdamW's 8 bytes per parameter
    (halved) are added to them; activations are 700 MiB a sample."""
    shard = sharded_state_bytes(GPT2_MEDIUM, 2, shard="full", bytes_per_param=8)
    adamw = sharded_state_bytes(GPT2_MEDIUM, 2, shard="full", bytes_per_param=8)
    big = _probed(0, 80 * GIB, shard + 300 * MIB, 700 * MIB, adamw)
    small = _probed(1, 0.08 * 80 * GIB, shard + 300 * MIB, 700 * MIB, adamw)
    caps = probe_caps([big, small], margin=0.1, min_batch=1)
    room = 0.9 * 0.08 * 80 * GIB - (shard + 300 * MIB + adamw)
    assert caps[1] == int(room // (700 * MIB)) == 4
    assert caps[0] > 90
    # The predicted peak at the cap stays under the limit less the margin, one more is over.
    assert small.peak_bytes(caps[1]) <= 0.9 * small.budget_bytes < small.peak_bytes(caps[1] + 1)


def test_a_rank_that_cannot_hold_min_batch_is_one_line_naming_rank_device_limit_and_need() -> None:
    ok = _probed(0, 80 * GIB, 4 * GIB, GIB, 2 * GIB)
    short = _probed(1, 8 * GIB, 4 * GIB, GIB, 2 * GIB)  # needs 7+ GiB at 1, has 7.2 GiB
    assert probe_caps([ok, short], margin=0.1, min_batch=1)[1] == 1
    with pytest.raises(PlanError) as err:
        probe_caps([ok, short], margin=0.1, min_batch=2)
    text = str(err.value)
    assert "\n" not in text
    assert "rank 1 (cuda:1) cannot hold min_batch 2" in text
    assert "predicted 8.00 GiB" in text and "limit 7.20 GiB (8.00 GiB less the 10% margin)" in text


def test_peaks_that_do_not_rise_with_the_batch_give_no_fit() -> None:
    assert probe_fit([(1, 5 * GIB), (2, 5 * GIB)]) is None
    assert probe_fit([(1, 5 * GIB), (2, 4 * GIB)]) is None
    assert probe_fit([(2, 5 * GIB)]) is None  # one size: no line


def _doubling(peak, share: int, floor: float = 0.0, limit: float = float("inf")):
    """The probe's sizes on one rank whose pass peaks at ``peak(b)``: 1 (the warm-up
    repeats it), 2, then doubling as :func:`hetero.trainer.memprobe.probe` does."""
    points = [(1, peak(1)), (2, peak(2))]
    size = 2
    while 2 * size <= share and probe_line_bends(points) and probe_pass_fits(points, floor, limit):
        size *= 2
        points.append((size, peak(size)))
    return points


def _gpt2_medium_recomputing(b: int) -> int:
    """The shape of GPT-2 medium's peaks with recomputation, sharded over 2× H100 (bytes):
    a moment that does not grow with the batch sets the peak up to 4 samples, then one
    that grows 0.27 GB a sample (the intervals' peaks of
    results/benchmarks/2026-11-27-gpu-shard-neighbour-h100.tar.gz)."""
    return int(max(3.37 * GIB, 2.145 * GIB + 0.2655 * GIB * b))


def test_peaks_that_bend_are_probed_past_the_bend_and_predicted_from_the_last_two() -> None:
    points = _doubling(_gpt2_medium_recomputing, share=32)
    assert [b for b, _ in points] == [1, 2, 4, 8, 16, 32]  # 8-16 is still steeper than 4-8
    fit = probe_fit(points[-2:])
    assert fit is not None
    for b in (8, 12, 32, 48):
        assert fit.peak_bytes(b) == pytest.approx(_gpt2_medium_recomputing(b), rel=0.01)
    # The first rising segment alone (what the probe used to stop at) predicts 12 samples
    # 20% low: the bend is above it.
    early = probe_fit([(4, _gpt2_medium_recomputing(4)), (8, _gpt2_medium_recomputing(8))])
    assert early is not None and early.peak_bytes(48) < 0.9 * _gpt2_medium_recomputing(48)


def test_straight_peaks_take_one_pass_to_confirm_and_the_share_bounds_the_doubling() -> None:
    line = lambda b: int(GIB + 0.1 * GIB * b)  # noqa: E731
    assert [b for b, _ in _doubling(line, share=64)] == [1, 2, 4]
    assert [b for b, _ in _doubling(_gpt2_medium_recomputing, share=8)] == [1, 2, 4, 8]
    assert [b for b, _ in _doubling(_gpt2_medium_recomputing, share=3)] == [1, 2]


def test_the_next_pass_is_taken_only_where_it_is_bounded_within_the_limit() -> None:
    # peak(2b) <= 2 peak(b) - floor for any peak made of lines that hold the floor.
    assert probe_pass_fits([(4, 5 * GIB)], floor_bytes=2 * GIB, limit=8 * GIB)
    assert not probe_pass_fits([(4, 5 * GIB)], floor_bytes=2 * GIB, limit=7.9 * GIB)
    points = _doubling(_gpt2_medium_recomputing, share=32, floor=2 * GIB, limit=6 * GIB)
    # 8 could need 2 x 3.37 - 2 = 4.74 GiB: taken; 16 could need 2 x 4.27 - 2 = 6.54: not.
    assert [b for b, _ in points] == [1, 2, 4, 8]
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):  # random convex peaks over a floor: the bound holds
        floor = float(torch.rand(1, generator=generator)) * GIB
        lines = [
            (floor + float(f) * GIB, float(a) * GIB)
            for f, a in torch.rand(4, 2, generator=generator).tolist()
        ]
        for b in (1, 2, 4, 8):
            now, doubled = (max(f + a * n for f, a in lines) for n in (b, 2 * b))
            assert doubled <= 2 * now - floor + 1e-3


def test_injection_spec() -> None:
    assert parse_injection("1:4e9:1e9:5e8, 0:8:2:1:0.5") == {
        1: (4e9, 1e9, 5e8, 5e8),  # no figure for recomputing: the same per sample
        0: (8, 2, 1, 0.5),
    }
    assert parse_injection(None) == {}
    for bad in ("1:4e9:1e9", "1:4e9:1e9:5e8:1e8:7"):
        with pytest.raises(ConfigError, match=INJECT_ENV):
            parse_injection(bad)


def test_optimizer_state_is_counted_per_parameter_until_the_first_step_allocates_it() -> None:
    model = nn.Linear(100, 10)  # 1,010 fp32 parameters
    adamw = torch.optim.AdamW(model.parameters())
    assert optimizer_state_bytes(adamw, torch.device("cpu")) == 2 * 4 * 1010
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert optimizer_state_bytes(sgd, torch.device("cpu")) == 4 * 1010
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    assert optimizer_state_bytes(plain, torch.device("cpu")) == 0
    model(torch.randn(3, 100)).sum().backward()
    adamw.step()
    assert optimizer_state_bytes(adamw, torch.device("cpu")) == 0  # allocated: measured later
    # Parameters on another kind of device (offloaded shards) hold no state here.
    assert optimizer_state_bytes(torch.optim.AdamW(model.parameters()), torch.device("cuda")) == 0


class _Noisy(nn.Module):
    """BatchNorm's running statistics and dropout's random draws: what a careless probe
    would change."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.relu(self.bn(self.fc(x)))))


class _Data(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _train(with_probe: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], dict, object]:
    monkeypatch.setenv(INJECT_ENV, "0:1e12:1e6:1e5")  # a CPU rank reporting peaks: probe runs
    torch.manual_seed(0)
    ctx = init("equal", device="cpu", min_batch=2)
    model = ctx.wrap(_Noisy())
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = ctx.loader(_Data(), 16, seed=1)
    loss_fn = nn.CrossEntropyLoss()
    found = None
    if with_probe:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        rng = torch.get_rng_state()

        def loss_of(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return loss_fn(model(batch[0]), batch[1])

        found = probe(ctx, model, opt, loader.samples, loss_of, margin=0.1)
        after = model.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before), "buffers or weights moved"
        assert torch.equal(rng, torch.get_rng_state()), "the probe drew from the RNG stream"
        assert all(p.grad is None for p in model.parameters())
        assert not opt.state, "the optimizer stepped"
    losses = []
    for x, y in loader:
        loss = loss_fn(model(x), y)
        ctx.backward(loss)
        opt.step()
        opt.zero_grad()
        ctx.step(loss)
        losses.append(loss.item())
        if ctx.global_step == 4:
            break
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ctx.close()
    return losses, state, found


def test_the_probe_leaves_training_bit_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_losses, plain_state, _ = _train(False, monkeypatch)
    losses, state, found = _train(True, monkeypatch)
    assert found is not None
    # Injected peaks 1 MB + 100 kB a sample, measured at min_batch 2 and 4, plus AdamW's
    # 2 × 4 bytes × 115 parameters; a 1 TB budget leaves a cap far above the batch.
    assert found.points == ((2, 1_200_000), (4, 1_400_000))
    assert found.ranks[0] is not None and found.ranks[0].optimizer_bytes == 8 * 115
    assert found.caps[0] == int((0.9e12 - 1e6 - 8 * 115) // 1e5)
    assert losses == plain_losses
    assert all(torch.equal(state[k], plain_state[k]) for k in state)


def _alone(min_batch: int, global_batch: int) -> tuple[object, nn.Module, object, object]:
    ctx = init("equal", device="cpu", min_batch=min_batch)
    model = ctx.wrap(_Noisy())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # no momentum: no state to add
    ctx.loader(_Data(), global_batch, seed=1)
    loss_fn = nn.CrossEntropyLoss()
    return ctx, model, opt, lambda b: loss_fn(model(b[0]), b[1])


def test_probe_memory_caps_the_plan_or_says_before_step_0_what_cannot_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One rank alone (its batch is the global batch): a cap at the batch is met, a cap
    below it is a one-line error, and a layer that refuses the probe's batch names it."""
    monkeypatch.setenv(INJECT_ENV, "0:1e7:2e6:1e6")  # 0.9 × 1e7 − 2e6 leaves 7 samples
    ctx, model, opt, loss_of = _alone(2, 7)
    assert ctx.probe_memory(model, opt, loss_of) == (7,)
    assert ctx.max_batch == (7,) and ctx.plan == (7,)
    ctx.close()
    monkeypatch.setenv(INJECT_ENV, "0:1e7:2e6:2e6")  # 3 samples
    ctx, model, opt, loss_of = _alone(2, 7)
    with pytest.raises(HeteroError, match="cannot hold the global batch 7"):
        ctx.probe_memory(model, opt, loss_of)
    ctx.close()
    ctx, model, opt, loss_of = _alone(1, 7)
    with pytest.raises(HeteroError, match="probe failed at batch 1: Expected more than 1 value"):
        probe_memory(ctx, model, opt, loss_of)  # BatchNorm1d refuses one sample in training
    ctx.close()


class _Blocky(nn.Module):
    """_Noisy's layers as one block that can be recomputed (a built-in model's switch)."""

    def __init__(self) -> None:
        super().__init__()
        from hetero.trainer.models.recompute import Blocks

        self.body = Blocks(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3), ends=(3,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_probe_memory_turns_recomputation_on_where_memory_binds(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Alone with a global batch of 7: 2 MB a sample leave 3 samples under 9 MB, 0.5 MB a
    sample recomputing leave 14. auto turns the switch on and the cap is 14; off keeps
    the cap of 3, which cannot hold the batch."""
    from hetero.trainer.models.recompute import recomputing

    monkeypatch.setenv(INJECT_ENV, "0:1e7:2e6:2e6:5e5")
    ctx = init("equal", device="cpu", min_batch=2, activation_checkpointing=mode)
    model = ctx.wrap(_Blocky())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx.loader(_Data(), 7, seed=1)
    loss_fn = nn.CrossEntropyLoss()
    try:
        if mode == "off":
            with pytest.raises(HeteroError, match="cannot hold the global batch 7"):
                ctx.probe_memory(model, opt, lambda b: loss_fn(model(b[0]), b[1]))
            assert not recomputing(model)
            return
        assert ctx.probe_memory(model, opt, lambda b: loss_fn(model(b[0]), b[1])) == (14,)
        assert recomputing(model) and ctx.recompute.ranks == (True,)
        assert ctx.recompute.reasons[0].startswith("on: memory holds 3 of the 7 samples")
    finally:
        ctx.close()
