"""Real streams of the field through ``ctx.loader``, local files only: a Hugging Face
``datasets`` stream of JSON lines files, and WebDataset tar shards written by its own
``TarWriter``. On one rank in this process, and on two Gloo ranks
(``workers/stream_jobs.py``'s ``hf-items``, ``hf-nodes`` and ``wds`` jobs, the plan
moving at every boundary): every step the plan's sizes, no sample twice within a pass,
each reader's samples the head of its part in order (docs/trainer.md, "Streams").

Marked ``ecosystem``: ``make test-ecosystem`` installs the packages (pyproject's
``ecosystem`` extra) and runs these tests; without them the module skips in one line.
The packages are looked up here and imported only under :func:`offline`'s environment:
``datasets`` reads its cache directory and offline switches when first imported.
"""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import streamcheck as check
import torch
from torch import nn

from hetero import trainer as ht
from hetero.core.errors import ConfigError

for _package in ("datasets", "webdataset"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(
            f"{_package} is not installed (make test-ecosystem installs it)",
            allow_module_level=True,
        )

_spec = importlib.util.spec_from_file_location(
    "stream_jobs", Path(__file__).parent / "workers" / "stream_jobs.py"
)
assert _spec and _spec.loader
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)

pytestmark = [pytest.mark.ecosystem, pytest.mark.slow]


def _numbered(sizes: tuple[int, ...]) -> list[list[int]]:
    """The ids of files (shards) of ``sizes`` samples, numbered across them."""
    ends = [sum(sizes[: k + 1]) for k in range(len(sizes))]
    return [list(range(end - n, end)) for n, end in zip(sizes, ends, strict=True)]


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The data directory (the JSON lines files and the shards), with Hugging Face's
    cache under the test's temporary directory and the Hub switched off, for this process
    and the ranks it starts."""
    data = tmp_path_factory.mktemp("data")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
        env.setenv("HF_DATASETS_OFFLINE", "1")
        env.setenv("HF_HUB_OFFLINE", "1")
        jobs.write_jsonl(data)
        jobs.write_webdataset(data)
        yield data


@pytest.fixture(scope="module")
def runs(ranks_in_turn: Any, offline: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``hf-items``, ``hf-nodes`` and ``wds`` jobs on one launch of two ranks."""
    out = tmp_path_factory.mktemp("ecosystem-streams")
    modes = ["hf-items", "hf-nodes", "wds"]
    ranks_in_turn(out, 2, [["stream_jobs.py", m, str(out / m), str(offline)] for m in modes])
    return out


def _files(data: Path, pass_: int) -> list[list[int]]:
    """The ids of each JSON lines file, in the order the Hugging Face stream reads the
    files in pass ``pass_``: its ``set_epoch`` shuffles them by the pass number (the same
    order in every process)."""
    stream = jobs.hugging_face_stream(data)
    stream.set_epoch(pass_)
    whole = [sample["id"] for sample in stream]
    return sorted(_numbered(jobs.JSONL), key=lambda ids: whole.index(ids[0]))


def _joined(files: list[list[int]]) -> list[int]:
    return [i for ids in files for i in ids]


def _one_rank(
    stream: Any, workers: int, split: str, steps: int, collate: Any = None
) -> list[check.Step]:
    """``steps`` steps of ``stream`` on one CPU rank, checked as every stream's steps are."""
    torch.manual_seed(0)
    ctx = ht.init("equal", device="cpu")
    try:
        model = ctx.wrap(nn.Linear(4, 3))
        loader = ctx.loader(
            stream, jobs.GLOBAL_BATCH, num_workers=workers, collate_fn=collate, split=split
        )
        record: list[Any] = []
        jobs.train(ctx, loader, model, steps, record)
    finally:
        ctx.close()
    run = check.steps([{"steps": record}])
    check.check_cut(run, jobs.GLOBAL_BATCH)
    return run


def test_a_hugging_face_stream_on_one_rank_is_read_whole_or_split_by_its_workers(
    offline: Path,
) -> None:
    from datasets.distributed import split_dataset_by_node

    stream = jobs.hugging_face_stream(offline)
    # split="items" without workers: the training thread reads the whole stream, a pass
    # of 7 steps (118 samples), then the next pass.
    run = _one_rank(stream, 0, "items", 10, jobs.pad)
    check.reader_order(run, lambda p: [_joined(_files(offline, p))], workers=1)
    assert [p for *_, p in run] == [0] * 7 + [1] * 3
    # With 2 workers Hugging Face gives each worker every other file: split="dataset",
    # after split_dataset_by_node as a job of several ranks would call it. Worker 1 has
    # the fewer samples (54 against 64) and ends the first pass at its fourth step.
    node = split_dataset_by_node(stream, rank=0, world_size=1)
    run = _one_rank(node, 2, "dataset", 10, jobs.pad)
    check.reader_order(run, lambda p: [_joined(_files(offline, p)[j::2]) for j in range(2)])
    assert [p for *_, p in run] == [0] * 7 + [1] * 3
    # Each worker set its passes on a copy of its own: the stream's epoch, in memory
    # shared with the workers, is untouched.
    assert node.epoch == 0
    # split="items" there would keep a part of each worker's part: refused in one line.
    ctx = ht.init("equal", device="cpu")
    try:
        with pytest.raises(ConfigError, match="splits its shards between DataLoader workers"):
            ctx.loader(stream, jobs.GLOBAL_BATCH, num_workers=2, collate_fn=jobs.pad)
    finally:
        ctx.close()


def test_a_stream_split_by_node_is_refused_a_second_split_item_by_item(offline: Path) -> None:
    """``split_dataset_by_node`` then ``split="items"`` kept 1 item in ``world_size`` of each
    rank's part, silently; now one line names the fix."""
    from datasets.distributed import split_dataset_by_node

    from hetero.trainer.stream import StreamReader

    node = split_dataset_by_node(jobs.hugging_face_stream(offline), rank=0, world_size=2)
    with pytest.raises(ConfigError, match=r"already split between ranks.*give split='dataset'"):
        StreamReader(node, rank=0, world_size=2, readers=1, split="items")
    StreamReader(node, rank=0, world_size=2, readers=1, split="dataset")  # what the docs say
    StreamReader(jobs.hugging_face_stream(offline), rank=0, world_size=2, readers=1, split="items")


def test_webdataset_shards_on_one_rank_are_split_between_its_workers_by_webdataset(
    offline: Path,
) -> None:
    shards = _numbered(jobs.WDS_SHARDS)
    run = _one_rank(jobs.webdataset_stream(offline), 2, "dataset", 6)
    # WebDataset's split_by_worker: worker j reads the shards j, j + 2, ...
    check.reader_order(run, [[i for s in shards[j::2] for i in s] for j in range(2)])


def test_a_hugging_face_stream_is_split_item_by_item_between_two_ranks(
    runs: Path, offline: Path
) -> None:
    got = check.load(runs, "hf-items")
    run = check.steps(got)
    check.check_cut(run, jobs.GLOBAL_BATCH)
    # No workers, split="items": rank r keeps items r, r + 2, ... of the whole stream.
    check.reader_order(
        run, lambda p: [_joined(_files(offline, p))[r::2] for r in range(2)], workers=1
    )
    passes = got[0]["passes"]
    assert passes == got[1]["passes"] and len(passes) >= 2, passes
    assert [p[1] for p in passes[1:]] == [p[2] for p in passes[:-1]]  # each where one ended
    assert len({plan for _, plan, _, _ in run}) >= 3  # plans moved within passes


def test_a_hugging_face_stream_split_by_node_gives_each_reader_its_own_file(
    runs: Path,
) -> None:
    run = check.steps(check.load(runs, "hf-nodes"))
    check.check_cut(run, jobs.GLOBAL_BATCH)
    files = _numbered(jobs.JSONL)
    # split_dataset_by_node gives each rank 2 of the 4 files, Hugging Face each of its
    # 2 workers one (which, set_epoch shuffles by the pass): in every pass each reader's
    # samples are the head of one file, each reader its own.
    readers: dict[int, dict[tuple[int, int], int]] = defaultdict(dict)
    for (pass_, rank, j), ids in check.taken(run, 2).items():
        (readers[pass_][rank, j],) = [k for k, f in enumerate(files) if f[: len(ids)] == ids]
    assert len(readers) >= 2 and len({plan for _, plan, _, _ in run}) >= 3
    for pass_, files_read in readers.items():
        assert len(set(files_read.values())) == len(files_read), (pass_, files_read)
        # Every reader read in each pass the run did not stop in.
        assert pass_ == max(readers) or len(files_read) == 4, (pass_, files_read)


def test_webdataset_shards_split_by_its_own_node_and_worker_splitters_train_exactly(
    runs: Path,
) -> None:
    got = check.load(runs, "wds")
    run = check.steps(got)
    check.check_cut(run, jobs.GLOBAL_BATCH)
    shards = _numbered(jobs.WDS_SHARDS)
    # Rank i reads the shards i, i + 2, ... (split_by_node), its worker j every other one
    # of those (split_by_worker).
    readers = [[i for s in shards[r // 2 :: 2][r % 2 :: 2] for i in s] for r in range(4)]
    check.reader_order(run, readers)
    assert len(got[0]["passes"]) >= 2 and len({plan for _, plan, _, _ in run}) >= 3
    for name, value in check.one_process(run, jobs.features).items():
        torch.testing.assert_close(got[0]["params"][name], value, rtol=1e-5, atol=1e-6)
