"""A stream's cut (trainer.stream): per step Σ b_i = B, no item twice within a pass, each
reader's items in order whatever the plans do, the pass's end where a part runs out, and
an exact resume.

The ranks run in lockstep in one process, as the stream's DataLoader would drive them:
the sampler's n-th request goes to reader n mod w (which refuses another's request),
each rank requests a random number of steps ahead of the one it hands out, and the
ranks end a pass at the first step one of them could not fill (``trainer.passend``
agrees on that step between processes: ``test_stream_distributed.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.core.errors import ConfigError
from hetero.trainer.stream import (
    StreamReader,
    StreamSampler,
    Take,
    split_shards,
    taken_before,
)

Item = tuple[int, int, int, int]  # (pass, rank, reader, k): the k-th item of a part


class Part:
    """A reader's part of a stream (``split="dataset"``): ``lengths[pass]`` items."""

    def __init__(self, rank: int, reader: int, lengths: list[int]) -> None:
        self.rank, self.reader, self.lengths = rank, reader, lengths
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Item]:
        n = self.lengths[min(self.epoch, len(self.lengths) - 1)]
        return ((self.epoch, self.rank, self.reader, k) for k in range(n))


class Ranks:
    """``world`` ranks of ``readers`` readers each, cutting the same plans in lockstep."""

    def __init__(self, lengths: list[list[list[int]]], plan: tuple[int, ...]) -> None:
        self.world, self.readers = len(lengths), len(lengths[0])
        self.samplers = [StreamSampler(plan, r, self.readers) for r in range(self.world)]
        self.parts = [
            [
                StreamReader(Part(r, j, lengths[r][j]), r, self.world, self.readers, "dataset", j)
                for j in range(self.readers)
            ]
            for r in range(self.world)
        ]
        self.consumed = 0  # the next step to hand out, the same on every rank
        self._restart()

    def _restart(self) -> None:
        """A new DataLoader iterator on every rank (a run's start, or a resume)."""
        for s in self.samplers:
            s.rewind(self.consumed)
        self.requests = [iter(s) for s in self.samplers]
        self.sent = [0] * self.world
        self.results: list[dict[int, list[Item] | None]] = [{} for _ in range(self.world)]

    def _request(self, rank: int) -> None:
        """The DataLoader's next request on ``rank``, fetched by the worker it goes to."""
        (take,) = next(self.requests[rank])
        reader = self.parts[rank][self.sent[rank] % self.readers]
        self.sent[rank] += 1
        got = reader.take(take)
        if take.size and take.pass_ == self.samplers[rank].epoch:
            self.results[rank][take.step] = got

    def step(self, ahead: list[int]) -> list[list[Item]] | None:
        """Every rank's batch of the next step (None: the pass ends there); each rank first
        requests up to ``ahead[rank]`` steps beyond it, as its read-ahead and prefetch do."""
        s = self.consumed
        for r in range(self.world):
            while self.samplers[r].global_step <= s + ahead[r]:
                self._request(r)
        got = [self.results[r].pop(s) for r in range(self.world)]
        if any(g is None for g in got):
            for r in range(self.world):
                self.samplers[r].end_pass(s)
                self.results[r].clear()
            return None
        self.consumed += 1
        return got  # type: ignore[return-value]

    def set_plan(self, plan: tuple[int, ...]) -> int:
        """Schedule ``plan`` at the first step no rank has requested; returns that step."""
        at = max(s.global_step for s in self.samplers)
        for s in self.samplers:
            s.set_plan(plan, at)
        return at

    def resume(self) -> None:
        """Restart every rank from rank 0's state, with fresh readers, as a resumed run."""
        state = self.samplers[0].state_dict(self.consumed)
        plan = self.samplers[0].schedule.plans[-1]
        self.samplers = [StreamSampler(plan, r, self.readers) for r in range(self.world)]
        for s in self.samplers:
            assert s.load_state_dict(state)
        self.parts = [
            [
                StreamReader(p.dataset, p.rank, self.world, self.readers, "dataset", j)
                for j, p in enumerate(row)
            ]
            for row in self.parts
        ]
        self._restart()


def _plan(draw: st.DrawFn, world: int, total: int) -> tuple[int, ...]:
    if world == 1:
        return (total,)
    cuts = sorted(
        draw(
            st.lists(st.integers(1, total - 1), min_size=world - 1, max_size=world - 1, unique=True)
        )
    )
    bounds = [0, *cuts, total]
    return tuple(bounds[i + 1] - bounds[i] for i in range(world))


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    world, readers = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    total = draw(st.integers(world, 24))
    lengths = [
        [draw(st.lists(st.integers(0, 90), min_size=3, max_size=3)) for _ in range(readers)]
        for _ in range(world)
    ]
    return {
        "lengths": lengths,
        "plans": [_plan(draw, world, total) for _ in range(draw(st.integers(1, 5)))],
        "change_at": sorted(draw(st.lists(st.integers(0, 40), min_size=4, max_size=4))),
        "ahead": [
            draw(st.lists(st.integers(0, 6), min_size=world, max_size=world)) for _ in range(6)
        ],
        "resume_at": draw(st.integers(0, 60)),
    }


def _run(sc: dict[str, object], steps: int, resume: bool = False) -> list[object]:
    """``steps`` steps (a pass's end as ``None``), each checked; what ran, in order.

    Without ``resume`` each plan change is scheduled as a boundary does, at the first
    step no rank has requested; with it, all are scheduled at the start, so a resumed
    run and one never stopped have the same plans by step."""
    plans: list[tuple[int, ...]] = sc["plans"]  # type: ignore[assignment]
    lengths: list[list[list[int]]] = sc["lengths"]  # type: ignore[assignment]
    ranks = Ranks(lengths, plans[0])
    pending = list(zip(sc["change_at"], plans[1:], strict=False))  # type: ignore[call-overload]
    if resume or sc.get("fixed"):
        for at, plan in pending:
            for sampler in ranks.samplers:
                sampler.set_plan(plan, at)
        pending = []
    ahead: list[list[int]] = sc["ahead"]  # type: ignore[assignment]
    ran: list[object] = []
    taken: dict[tuple[int, int, int], list[int]] = {}  # (pass, rank, reader) -> its ks
    for n in range(steps):
        if resume and n == sc["resume_at"]:
            ranks.resume()
        while pending and pending[0][0] <= n:
            ranks.set_plan(pending.pop(0)[1])
        step, s0 = ranks.consumed, ranks.samplers[0]
        sizes, pass_, j = s0.schedule.at(step), s0.epoch, s0.reader_of(step)
        got = ranks.step(ahead[n % len(ahead)])
        ran.append(got)
        left = [
            lengths[r][j][min(pass_, 2)] - len(taken.get((pass_, r, j), []))
            for r in range(ranks.world)
        ]
        if got is None:
            # The pass ends at the first step that some rank's reader cannot fill.
            assert any(have < b for have, b in zip(left, sizes, strict=True))
            if s0.pass_start == step and s0.epoch > 3:
                break  # passes without a step: the parts are shorter than a batch
            continue
        assert [len(b) for b in got] == list(sizes), "a rank's batch is not its planned share"
        assert sum(len(b) for b in got) == sum(plans[0])
        for r, batch in enumerate(got):
            assert {(p, rank, reader) for p, rank, reader, _ in batch} == {(pass_, r, j)}
            taken.setdefault((pass_, r, j), []).extend(k for *_, k in batch)
    for key, ks in taken.items():
        # A reader's items in a pass: the head of its part, in order, none twice.
        assert ks == list(range(len(ks))), (key, ks)
    return ran


@settings(max_examples=120, deadline=None)
@given(scenarios())
def test_every_step_is_the_global_batch_cut_by_the_plan_and_no_item_comes_twice(sc):
    _run(sc, 80)


@settings(max_examples=80, deadline=None)
@given(scenarios())
def test_a_resumed_run_takes_the_same_items_as_one_never_stopped(sc):
    assert _run(sc, 70, resume=True) == _run(sc | {"fixed": True}, 70)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(1, 9)), max_size=6),
    st.integers(0, 60),
    st.integers(0, 80),
    st.integers(1, 4),
    st.integers(0, 1),
)
def test_taken_before_counts_what_the_requests_carried(changes, start, step, readers, rank):
    """The counts that a checkpoint's schedule gives are those the requests carried."""
    sampler = StreamSampler((5, 5), rank, readers)
    sampler.end_pass(start)  # a pass that began at ``start``
    for at, first in sorted(changes):
        sampler.set_plan((first, 10 - first), max(at, start))
    requests: Iterator[list[Take]] = iter(sampler)
    counted = [0] * readers
    while sampler.global_step < max(step, start):
        (take,) = next(requests)
        if take.size:
            assert take.before == counted[take.reader]
            counted[take.reader] += take.size
    assert taken_before(sampler.schedule, rank, start, sampler.global_step, readers) == counted


def test_item_split_keeps_every_rth_item_of_the_whole_stream():
    stream = list(range(20))
    parts = []
    for rank in range(2):
        for j in range(2):
            reader = StreamReader(stream, rank, 2, 2, "items", worker=j)
            parts.append(reader.take(Take(0, 0, j, 5, 0)))
    assert parts == [list(range(r, 20, 4)) for r in range(4)]
    # The fifth item of reader 3 is not there: its part ended.
    assert StreamReader(stream, 1, 2, 2, "items", worker=1).take(Take(0, 0, 1, 6, 0)) is None


def test_a_reader_refuses_another_readers_request():
    reader = StreamReader(range(10), 0, 1, 2, "items", worker=0)
    with pytest.raises(RuntimeError, match="reader 0 got the request of reader 1"):
        reader.take(Take(0, 1, 1, 2, 0))


def test_split_shards_gives_each_reader_every_rth_shard(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert split_shards([f"s{i}" for i in range(7)]) == ["s1", "s4"]
    with pytest.raises(ConfigError, match=r"2 shard\(s\) for 3 readers"):
        split_shards(["a", "b"])


def test_a_stream_checkpoint_resumes_a_new_pass_on_other_readers():
    sampler = StreamSampler((4, 4), 0, 2)
    it = iter(sampler)
    for _ in range(5):
        next(it)
    state = sampler.state_dict(3)
    other = StreamSampler((4, 4), 0, 3)
    assert not other.load_state_dict(state)
    assert (other.epoch, other.pass_start, other.global_step) == (1, 3, 3)
    same = StreamSampler((4, 4), 0, 2)
    assert same.load_state_dict(state)
    assert (same.epoch, same.pass_start, same.global_step) == (0, 0, 3)
    requests = iter(same)
    # Step 3 is reader 1's (after its step 1, 4 items): a pad to reader 0 goes first.
    assert [next(requests), next(requests)] == [[Take(0, 3, 0, 0, 0)], [Take(0, 3, 1, 4, 4)]]
