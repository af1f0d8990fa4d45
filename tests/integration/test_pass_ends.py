"""The ranks' agreement on where a stream's pass ends (trainer.passend), on two real Gloo
processes: whatever each rank reads ahead and whenever the period changes, every rank
ends each pass at the same step, the first one some rank could not fill, and names it."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetero.trainer.passend import MAX_PERIOD, PassEnds

PASSES = 12


def _shorts(seed: int) -> list[list[int]]:
    """Per pass, each rank's first step it cannot fill, counted from the pass's start."""
    rng = random.Random(seed)
    return [[rng.randint(0, 40) for _ in range(2)] for _ in range(PASSES)]


def _rank(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    ends = PassEnds(rank, 2)
    rng = random.Random(rank)  # each rank's own timing
    pace = random.Random(7)  # the summaries: the same on both ranks at the same step
    summaries: list[list[SimpleNamespace]] = []
    got, start, periods = [], 0, set()
    for shorts in _shorts(3):
        ends.start(start)
        short, step = start + shorts[rank], start
        while True:
            if step % 5 == 0:  # a boundary: new summaries, a new pace
                summaries.append([SimpleNamespace(step_s=pace.choice([0.004, 0.02, 0.2]))] * 2)
            ends.pace(step, summaries)
            periods.add(ends.period)
            want = step + ends.read_ahead()
            read = min(want, short - 1)
            if rng.random() < 0.3:
                torch.randn(20000).sum()  # one rank slower than the other, now and then
            if not ends.agree(step, read, short if want >= short else None):
                break
            step += 1
        got.append((start, step, ends.short_rank))
        start = step
    torch.save({"got": got, "periods": periods, "rounds": ends.rounds}, f"{out}.{rank}")
    ends.close()
    dist.destroy_process_group()


def test_every_rank_ends_each_pass_at_the_first_step_one_could_not_fill(tmp_path: Path) -> None:
    # Forked: the children start with torch imported (spawning imports it again: seconds).
    mp.start_processes(
        _rank, args=(str(tmp_path / "store"), str(tmp_path / "out")), nprocs=2, start_method="fork"
    )
    results = [torch.load(tmp_path / f"out.{r}") for r in range(2)]
    assert results[0]["got"] == results[1]["got"]
    assert results[0]["rounds"] == results[1]["rounds"]
    start = 0
    for (first, end, rank), shorts in zip(results[0]["got"], _shorts(3), strict=True):
        assert first == start and end == start + min(shorts)
        assert rank == shorts.index(min(shorts))
        start = end
    assert {1, MAX_PERIOD} <= results[0]["periods"]  # paced, and at every step
