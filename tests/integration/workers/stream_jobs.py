"""Rank worker: a user's own data on two ranks: a collate function, streams, logging.

Usage: stream_jobs.py MODE OUT_PREFIX [DATA_DIR]

- ``collate``: a map-style dataset of sequences of 1 to 6 tokens, batched by the user's
  collate function (padded, with lengths) in 2 DataLoader workers per rank, while the
  plan moves at every boundary; 2 epochs.
- ``generator``: a stream of dict samples (what a Hugging Face ``datasets`` stream
  yields) from a plain generator ``IterableDataset``, split item by item
  (``split="items"``) between the 2 ranks, read and padded by the same collate function
  on the training thread, the plan moving at every boundary; several passes. Two
  ``on_interval`` callbacks (one records the figures, one always raises) and
  ``tensorboard=OUT_PREFIX.tb``.
- ``tar``: WebDataset-style tar shards (``KEY.cls`` and ``KEY.x`` members) under
  DATA_DIR read with ``tarfile``, one shard per reader (``split_shards``,
  ``split="dataset"``), plans set by hand mid-pass; a checkpoint at step
  :data:`CHECKPOINT_AT` in the second pass, then on to :data:`TAR_STEPS`.
- ``tar-resume``: the ``tar`` job again from its checkpoint, to the same step.
- ``hf-items``: the JSON lines files of :func:`write_jsonl` under DATA_DIR as a Hugging
  Face ``datasets`` stream (``load_dataset("json", ..., streaming=True)``), split item by
  item between the 2 ranks, no workers, padded by the collate function, the plan moving
  at every boundary.
- ``hf-nodes``: the same stream cut by ``split_dataset_by_node`` and, in each rank's 2
  workers, by the dataset itself (``split="dataset"``).
- ``wds``: the tar shards of :func:`write_webdataset` under DATA_DIR read by
  ``webdataset.WebDataset`` with its own node and worker splitters (``split="dataset"``),
  2 workers per rank, the plan moving at every boundary.

The ``hf-*`` and ``wds`` jobs need the ``datasets`` and ``webdataset`` packages (``make
test-ecosystem``); the test writes their files before the ranks start.

Every rank saves, per step, the global step, the plan that ran and the ids of its
samples; and the final parameters, the loader's passes and the callbacks' figures.
A step of each job sleeps 30 ms, so that the pass agreement's period is one step on any
host (``trainer.passend``: the steps in 50 ms) and every run of a job cuts the same steps.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from hetero import trainer as ht
from hetero.core.balancer import Decision, equal_batches
from hetero.trainer.exchange import EmbeddedPlanner

GLOBAL_BATCH = 16
COMPUTE_S = 0.03
CYCLE = ((12, 4), (4, 12), (10, 6), (6, 10))
#: The tar job: shards of these many samples (one per reader: 2 ranks x 2 workers).
SHARDS = (40, 44, 36, 48)
TAR_PLANS = ((3, (5, 11)), (8, (12, 4)), (14, (9, 7)))
CHECKPOINT_AT, TAR_STEPS = 15, 22
#: The ``hf-*`` jobs: JSON lines files of these many samples (one per reader of ``hf-nodes``).
JSONL = (30, 26, 34, 28)
#: The ``wds`` job: tar shards of these many samples; reader (rank i, worker j) reads the
#: shards ``[i::2][j::2]`` (WebDataset's ``split_by_node``, then ``split_by_worker``).
WDS_SHARDS = (22, 18, 25, 20, 17, 24)


def features(i: int) -> tuple[torch.Tensor, int]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, generator=g), i % 3


class Cycling:
    """Equal at first, then the plan after the current one in ``CYCLE``, at every boundary."""

    name = "cycling"

    def initial(self, constraints, profiles=None):  # type: ignore[no-untyped-def]
        return equal_batches(constraints)

    def next_plan(self, history, current, constraints, profiles=None, horizon=None):  # type: ignore[no-untyped-def]
        at = CYCLE.index(tuple(current)) + 1 if tuple(current) in CYCLE else 0
        return Decision(CYCLE[at % len(CYCLE)], True, "next in the cycle")


class Kept:
    """Never moves: the plans are the ones set by hand."""

    name = "kept"

    def initial(self, constraints, profiles=None):  # type: ignore[no-untyped-def]
        return equal_batches(constraints)

    def next_plan(self, history, current, constraints, profiles=None, horizon=None):  # type: ignore[no-untyped-def]
        return Decision(tuple(current), False, "kept")


def pad(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The user's collate function: token lists padded with -1 to the longest, with
    their lengths, ids and labels."""
    longest = max(len(s["tokens"]) for s in samples)
    tokens = torch.full((len(samples), longest), -1, dtype=torch.long)
    for k, s in enumerate(samples):
        tokens[k, : len(s["tokens"])] = torch.tensor(s["tokens"])
    return {
        "tokens": tokens,
        "lengths": torch.tensor([len(s["tokens"]) for s in samples]),
        "id": torch.tensor([s["id"] for s in samples]),
        "label": torch.tensor([s["label"] for s in samples]),
    }


def sequence(i: int) -> dict[str, Any]:
    """Sample ``i``: 1 to 6 tokens, each ``i``."""
    return {"id": i, "tokens": [i] * (1 + i % 6), "label": i % 3}


class Sequences(Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> dict[str, Any]:
        return sequence(i)


class Generated(IterableDataset[dict[str, Any]]):
    """The whole stream in every process: ``split="items"`` cuts it."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (sequence(i) for i in range(150))


class TarShards(IterableDataset[tuple[torch.Tensor, int, int]]):
    """WebDataset's layout: each sample a ``KEY.x`` (4 float32) and a ``KEY.cls`` member."""

    def __init__(self, shards: list[Path]) -> None:
        self.shards = shards

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, int]]:
        for path in ht.split_shards(self.shards):
            with tarfile.open(path) as tar:
                members = tar.getmembers()
                for x, cls in zip(members[::2], members[1::2], strict=True):
                    data = tar.extractfile(x).read()  # type: ignore[union-attr]
                    label = int(tar.extractfile(cls).read())  # type: ignore[union-attr]
                    yield (
                        torch.frombuffer(bytearray(data), dtype=torch.float32),
                        label,
                        int(x.name.split(".")[0]),
                    )


def write_shards(data_dir: Path) -> list[Path]:
    """The tar shards of the ``tar`` jobs, sample ids numbered across them."""
    paths, first = [], 0
    for k, n in enumerate(SHARDS):
        path = data_dir / f"shard-{k:02d}.tar"
        paths.append(path)
        if not path.exists():  # both ranks may write it: each whole, then renamed over
            part = path.with_name(f"{path.name}.{os.getpid()}")
            with tarfile.open(part, "w") as tar:
                for i in range(first, first + n):
                    x, label = features(i)
                    for name, data in (
                        (f"{i:06d}.x", x.numpy().tobytes()),
                        (f"{i:06d}.cls", str(label).encode()),
                    ):
                        info = tarfile.TarInfo(name)
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
            os.replace(part, path)
        first += n
    return paths


def write_jsonl(data_dir: Path) -> list[Path]:
    """The ``hf-*`` jobs' files: :func:`sequence` ``i`` per line, ids numbered across them."""
    paths, first = [], 0
    for k, n in enumerate(JSONL):
        path = data_dir / f"part-{k:02d}.jsonl"
        part = path.with_name(f"{path.name}.{os.getpid()}")  # as write_shards: whole, renamed
        part.write_text("".join(json.dumps(sequence(i)) + "\n" for i in range(first, first + n)))
        os.replace(part, path)
        paths.append(path)
        first += n
    return paths


def write_webdataset(data_dir: Path) -> list[Path]:
    """The ``wds`` job's shards, written by WebDataset's ``TarWriter``: sample ``i`` is
    ``KEY.npy`` (:func:`features`' 4 float32) and ``KEY.cls``, ``KEY`` its id."""
    import webdataset as wds

    paths, first = [], 0
    for k, n in enumerate(WDS_SHARDS):
        path = data_dir / f"wds-{k:02d}.tar"
        with wds.TarWriter(str(path)) as writer:
            for i in range(first, first + n):
                x, label = features(i)
                writer.write({"__key__": f"{i:06d}", "npy": x.numpy(), "cls": label})
        paths.append(path)
        first += n
    return paths


def hugging_face_stream(data_dir: Path) -> Any:
    """The ``hf-*`` jobs' files as a Hugging Face stream, one shard per file."""
    import datasets

    files = [str(p) for p in sorted(data_dir.glob("part-*.jsonl"))]
    return datasets.load_dataset("json", data_files=files, split="train", streaming=True)


def webdataset_stream(data_dir: Path) -> Any:
    """The ``wds`` job's shards: ``(x, label, id)`` per sample, each rank its shards
    (``split_by_node``) and each of its workers some of them (the default
    ``split_by_worker``)."""
    import webdataset as wds

    urls = [str(p) for p in sorted(data_dir.glob("wds-*.tar"))]
    return (
        wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
        .decode()
        .to_tuple("npy", "cls", "__key__")
        .map_tuple(torch.from_numpy, int, int)
    )


def train(
    ctx: Any,
    loader: Any,
    model: nn.Module,
    steps: int,
    record: list[Any],
    *,
    checkpoint: Path | None = None,
) -> None:
    """``steps`` steps of ``model`` (SGD, lr 0.1, mean cross-entropy) over ``loader``'s
    passes; ``record`` gets, per step, the global step, the plan, this rank's sample ids
    and the pass."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    while ctx.global_step < steps:
        for batch in loader:
            if isinstance(batch, dict):
                x = nn.functional.one_hot(batch["tokens"].clamp(min=0) % 4, 4).float().sum(1)
                y, ids = batch["label"], batch["id"]
                assert (batch["tokens"] >= 0).sum(1).tolist() == batch["lengths"].tolist()
            else:
                x, y, ids = batch
            record.append((ctx.global_step, ctx.running_plan, ids.tolist(), loader.epoch))
            loss = nn.functional.cross_entropy(model(x), y)
            time.sleep(COMPUTE_S)
            ctx.backward(loss)
            opt.step()
            opt.zero_grad()
            ctx.step(loss)
            if checkpoint is not None and ctx.global_step == CHECKPOINT_AT:
                ht.save_checkpoint(checkpoint, ctx, model, opt)
            if ctx.global_step >= steps:
                break


def main(argv: list[str]) -> None:
    mode, prefix = argv[0], argv[1]
    torch.manual_seed(0)
    figures: list[dict[str, Any]] = []
    tar = mode.startswith("tar")
    options: dict[str, Any] = {"tensorboard": f"{prefix}.tb"} if mode == "generator" else {}
    ctx = ht.init("equal", rebalance_interval=4, comm="deferred", **options)
    model = ctx.wrap(nn.Linear(4, 3))
    if mode == "collate":
        loader = ctx.loader(Sequences(), GLOBAL_BATCH, seed=3, num_workers=2, collate_fn=pad)
    elif mode == "generator":
        loader = ctx.loader(Generated(), GLOBAL_BATCH, collate_fn=pad)
        ctx.on_interval(figures.append)
        ctx.on_interval(lambda f: 1 / 0)
    elif mode == "hf-items":
        loader = ctx.loader(hugging_face_stream(Path(argv[2])), GLOBAL_BATCH, collate_fn=pad)
    elif mode == "hf-nodes":
        from datasets.distributed import split_dataset_by_node

        stream = hugging_face_stream(Path(argv[2]))
        stream = split_dataset_by_node(stream, rank=ctx.rank, world_size=ctx.world_size)
        loader = ctx.loader(stream, GLOBAL_BATCH, num_workers=2, collate_fn=pad, split="dataset")
    elif mode == "wds":
        stream = webdataset_stream(Path(argv[2]))
        loader = ctx.loader(stream, GLOBAL_BATCH, num_workers=2, split="dataset")
    else:
        shards = write_shards(Path(argv[2]))
        loader = ctx.loader(TarShards(shards), GLOBAL_BATCH, num_workers=2, split="dataset")
    assert isinstance(ctx.planner, EmbeddedPlanner)
    ctx.planner = EmbeddedPlanner(Kept() if tar else Cycling(), ctx.planner.constraints)
    checkpoint = Path(argv[2]) / "last.pt" if tar else None
    if mode == "tar":
        for at, plan in TAR_PLANS:
            ctx.set_plan(plan, at)
    elif mode == "tar-resume":
        assert checkpoint is not None
        ht.load_checkpoint(checkpoint, ctx, model)
    record: list[Any] = []
    steps = TAR_STEPS if tar else 24
    train(ctx, loader, model, steps, record, checkpoint=checkpoint if mode == "tar" else None)
    torch.save(
        {
            "steps": record,
            "params": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
            "passes": getattr(loader, "passes", None),
            "figures": figures,
            "plans": [vars(p) for p in ctx.plans],
        },
        f"{prefix}.rank{ctx.rank}",
    )
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1:])
