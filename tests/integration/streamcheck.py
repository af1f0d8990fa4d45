"""What a stream's steps must show (``workers/stream_jobs.py``'s records): each step the
global batch cut by the plan, no sample twice within a pass, each reader's samples the
head of its part in order (docs/trainer.md, "Streams"), and the parameters one process
reaches over the same global batches."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: Per step: the global step, the plan, each rank's sample ids and the pass.
Step = tuple[int, tuple[int, ...], list[list[int]], int]


def load(runs: Path, mode: str, ranks: int = 2) -> list[dict[str, Any]]:
    """Every rank's record of job ``mode``."""
    return [torch.load(runs / f"{mode}.rank{r}", weights_only=False) for r in range(ranks)]


def steps(got: Sequence[dict[str, Any]]) -> list[Step]:
    """The steps the ranks ran, checked to be the same steps of the same plans."""
    out = []
    for per_rank in zip(*(g["steps"] for g in got), strict=True):
        step, plan, _, pass_ = per_rank[0]
        assert all((s, p, e) == (step, plan, pass_) for s, p, _, e in per_rank), per_rank
        out.append((step, tuple(plan), [ids for _, _, ids, _ in per_rank], pass_))
    return out


def check_cut(run: Sequence[Step], global_batch: int) -> None:
    """Every step the global batch cut by the plan; no sample twice within a pass."""
    seen: dict[int, set[int]] = defaultdict(set)
    for step, plan, ids, pass_ in run:
        assert [len(i) for i in ids] == list(plan) and sum(plan) == global_batch, step
        for i in (i for part in ids for i in part):
            assert i not in seen[pass_], f"sample {i} twice in pass {pass_}"
            seen[pass_].add(i)


def taken(run: Sequence[Step], workers: int) -> dict[tuple[int, int, int], list[int]]:
    """Each reader's ids per pass, ``(pass, rank, worker)``, in the order its steps took
    them: step ``s`` of a pass begun at ``p`` is read by worker ``(s - p) mod workers``."""
    out: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    starts: dict[int, int] = {}
    for step, _, _, pass_ in run:
        starts.setdefault(pass_, step)
    for step, _, ids, pass_ in run:
        j = (step - starts[pass_]) % workers
        for rank, part in enumerate(ids):
            out[pass_, rank, j] += part
    return out


def reader_order(
    run: Sequence[Step],
    readers: Sequence[Sequence[int]] | Callable[[int], Sequence[Sequence[int]]],
    workers: int = 2,
) -> dict[tuple[int, int, int], list[int]]:
    """:func:`taken`, each reader's ids checked to be the head of its part in order (reader
    ``r``: worker ``r mod workers`` of rank ``r div workers``). ``readers``: the parts, or
    the parts of a pass (a stream whose ``set_epoch`` reorders it)."""
    got = taken(run, workers)
    for (pass_, rank, j), ids in got.items():
        parts = readers(pass_) if callable(readers) else readers
        part = parts[rank * workers + j]
        assert ids == list(part[: len(ids)]), (pass_, rank, j)
    return got


def one_process(
    run: Sequence[Step], features: Callable[[int], tuple[torch.Tensor, int]]
) -> dict[str, torch.Tensor]:
    """The parameters one process reaches over each step's global batch (rank 0's samples,
    then rank 1's), ``features(i)`` sample ``i``, with ``stream_jobs.train``'s model
    (``nn.Linear(4, 3)`` after ``torch.manual_seed(0)``), optimizer and mean loss."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _, _, ids, _ in run:
        x, y = zip(*(features(i) for part in ids for i in part), strict=True)
        nn.functional.cross_entropy(model(torch.stack(x)), torch.tensor(y)).backward()
        opt.step()
        opt.zero_grad()
    return model.state_dict()
