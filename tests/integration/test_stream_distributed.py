"""A user's own data on two Gloo ranks: a collate function, streams, their resume, and
the interval's figures for the user's loggers (``workers/stream_jobs.py``).

The ``generator`` job streams what a Hugging Face ``datasets`` stream yields (dict samples
from an ``IterableDataset``) through the same path (``split="items"``); the real
``datasets`` and ``webdataset`` streams: ``test_ecosystem_streams.py`` (``make
test-ecosystem``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import streamcheck as check
import torch

_spec = importlib.util.spec_from_file_location(
    "stream_jobs", Path(__file__).parent / "workers" / "stream_jobs.py"
)
assert _spec and _spec.loader
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(ranks_in_turn, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every job of ``stream_jobs.py`` on one launch of two ranks: ``MODE.rank<R>``."""
    out = tmp_path_factory.mktemp("streams")
    data = out / "data"
    data.mkdir()
    modes = ["collate", "generator", "tar", "tar-resume"]
    ranks_in_turn(out, 2, [["stream_jobs.py", m, str(out / m), str(data)] for m in modes])
    return out


def test_a_collate_function_batches_variable_length_samples_in_the_workers(runs: Path):
    # Map-style: the epoch of a step is its place in the sampler's order (6 steps each).
    steps = [(s, plan, ids, s // 6) for s, plan, ids, _ in check.steps(check.load(runs, "collate"))]
    check.check_cut(steps, jobs.GLOBAL_BATCH)
    plans = [plan for _, plan, _, _ in steps]
    assert set(plans) > set(jobs.CYCLE[:2]), plans  # the plan moved, the workers went on
    for epoch in range(4):  # map-style: every sample once per epoch (96 / 16 = 6 steps)
        ids = sorted(i for s, _, both, _ in steps if s // 6 == epoch for i in both[0] + both[1])
        assert ids == list(range(96))


def test_a_generator_stream_is_split_item_by_item_and_each_pass_ends_together(runs: Path):
    got = check.load(runs, "generator")
    steps = check.steps(got)
    check.check_cut(steps, jobs.GLOBAL_BATCH)
    # split="items", one reader per rank (no workers): rank r keeps items r, r + 2, ...
    readers = [list(range(r, 150, 2)) for r in range(2)]
    taken = check.reader_order(steps, readers, 1)
    passes = got[0]["passes"]
    assert passes == got[1]["passes"] and len(passes) >= 2, passes
    assert [p[1] for p in passes[1:]] == [p[2] for p in passes[:-1]]  # each where one ended
    for pass_, _, end, rank in passes:
        # The pass ended at the first step a reader could not fill: at ``end``, ``rank``
        # had fewer items left than its share.
        plan = [p["batches"] for p in got[0]["plans"] if p["apply_at_step"] <= end][-1]
        left = len(readers[rank]) - len(taken[pass_, rank, 0])
        assert left < plan[rank], (pass_, end, rank, left, plan)
    assert len({plan for _, plan, _, _ in steps}) >= 3  # plans moved within passes


def test_tar_shards_read_one_per_reader_resume_mid_pass_with_exact_gradients(runs: Path):
    got = check.load(runs, "tar")
    steps = check.steps(got)
    check.check_cut(steps, jobs.GLOBAL_BATCH)
    first = 0
    readers = []
    for n in jobs.SHARDS:  # split_shards: reader r (rank 2 + worker) reads shard r
        readers.append(list(range(first, first + n)))
        first += n
    check.reader_order(steps, readers)
    # The plans set by hand and the shards' lengths end the passes at steps 6, 12, 20.
    assert got[0]["passes"] == [(0, 0, 6, 1), (1, 6, 12, 0), (2, 12, 20, 0)]
    assert [s for s, *_ in steps] == list(range(jobs.TAR_STEPS))
    # Exact: one process over each step's global batch (rank 0's samples, then rank
    # 1's) with the mean loss reaches the same parameters.
    for name, value in check.one_process(steps, jobs.features).items():
        torch.testing.assert_close(got[0]["params"][name], value, rtol=1e-5, atol=1e-6)
    # Resumed from the checkpoint at step 15 (pass 2, three steps in): the same samples
    # step by step, and the same parameters.
    resumed = check.load(runs, "tar-resume")
    assert check.steps(resumed) == [s for s in steps if s[0] >= jobs.CHECKPOINT_AT]
    for name, value in got[0]["params"].items():
        torch.testing.assert_close(resumed[0]["params"][name], value)


def test_on_interval_hands_rank_0_every_ranks_figures_and_tensorboard_gets_them(runs: Path):
    got = check.load(runs, "generator")
    figures = got[0]["figures"]
    assert got[1]["figures"] == []  # rank 0 only
    assert [f["step"] for f in figures] == list(range(4, 25, 4))
    for f in figures:
        assert [r["rank"] for r in f["ranks"]] == [0, 1]
        assert [r["batch"] for r in f["ranks"]] == f["plan"] and sum(f["plan"]) == 16
        assert f["samples_per_s"] > 0 and f["loss"] is not None and f["reason"]
        for r in f["ranks"]:
            assert r["compute_s"] >= 0 and set(r["phases_s"]) >= {"data", "comm"}
            assert r["input_s"] is None  # read on the training thread: its wait is data
    measured = [f for f in figures if f["gap"] is not None]
    assert measured, "no interval had a gap breakdown"
    for f in measured:
        terms = f["gap"]["terms_ms"]
        assert terms["imbalance"] is not None and terms["optimizer"] is None  # no ideal
    # The callback that raised at every boundary stopped nothing (24 steps ran), and
    # TensorBoard has the job's run and each rank's.
    assert len(got[0]["steps"]) == 24
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    tags = {}
    for run in ("job", "rank0", "rank1"):
        acc = accumulator.EventAccumulator(str(runs / "generator.tb" / run))
        acc.Reload()
        tags[run] = set(acc.Tags()["scalars"])
    assert {"throughput/samples_per_s", "loss/global", "gap/imbalance_ms"} <= tags["job"]
    assert {"plan/batch", "time_s/compute", "time_s/data"} <= tags["rank1"] == tags["rank0"]
