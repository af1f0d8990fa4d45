"""Streams: each rank draws its planned share of every global batch from its own part.

A stream is a dataset read by iterating it (``torch.utils.data.IterableDataset``:
WebDataset-style tar shards, a Hugging Face ``datasets`` stream, a generator over
files). It cannot be cut by index as the map-style sampler cuts its permutation, so
the stream is split between *readers* and each rank's readers make its batches:

- **Readers.** A rank with ``w`` DataLoader workers has ``w`` readers (without
  workers, one: the training thread); the job has ``R = world · w``, and worker ``j``
  of rank ``i`` is reader ``r = i · w + j``. Each reader iterates its own part of the
  stream. With ``split="items"`` hetero keeps the items ``k ≡ r (mod R)`` of what the
  dataset yields: right for any dataset that yields the whole stream in every
  process, which each reader then reads whole. With ``split="dataset"`` the dataset
  yields only its reader's part itself: :func:`split_shards` over its files, or
  Hugging Face's ``split_dataset_by_node``. A Hugging Face stream splits its shards
  between a rank's workers on its own (WebDataset's too, by default), so with workers
  it takes ``split="dataset"``: ``split="items"`` is refused for it.
- **Steps.** Step ``s`` of a pass that began at step ``p`` is made on every rank by
  its reader ``j = (s − p) mod w``, from the next ``b_i(s)`` items of that reader's
  part, ``b_i(s)`` the rank's size in the plan in force at ``s``. Every step holds
  exactly ``B`` samples, ``b_i`` of them from rank ``i``: the gradient weighting is the
  map-style path's.
- **Passes.** A pass is one iteration of the dataset by every reader (each calls
  ``dataset.set_epoch(pass)`` first, where the dataset has it). It ends for every rank
  at the first step that some reader of some rank cannot fill, and that step is not
  run (``trainer.passend``: how the ranks agree on it). Within a pass a reader hands
  out no item twice, and the items of its part go to its steps in the order the part
  yields them, whatever the plans do; what is left of the parts when the pass ends
  (less than a batch on the reader that ran out, any amount on the others) is not
  trained on in that pass. With disjoint parts (both splits make them) no sample is
  seen twice within a pass: what "every sample once per epoch" becomes for a stream.
- **Plans.** A new plan changes only how many items the next requests ask for; the
  requests carry the sizes to the workers, which keep their iterators: nothing
  restarts, as on the map-style path.
- **Resume.** A reader's position in its part is how many items it took in the pass.
  Every request carries it (``before``), counted in the main process from the plan
  schedule, so a checkpoint needs only the pass, the step it began at, the step
  reached and the schedule, as the map-style sampler's state. A resumed reader skips
  that many items of its part: reading them again costs what reading costs, and a
  stream that yields another order when iterated again resumes at the same count, not
  at the same items. With another world size or worker count the parts are others,
  and the resumed run starts a new pass.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, NamedTuple, TypeVar

from torch.utils.data import Dataset, get_worker_info

from hetero.core.errors import CheckpointError, ConfigError
from hetero.core.rankenv import RankEnv
from hetero.trainer.inputrate import TimedCollate
from hetero.trainer.sampler import PlannedSampler, PlanSchedule

T = TypeVar("T")

#: ``split`` values: hetero keeps every R-th item, or the dataset yields its reader's part.
SPLITS = ("items", "dataset")


class Take(NamedTuple):
    """One request to a reader: the batch of global step ``step`` in pass ``pass_``, from
    the next ``size`` items of reader ``reader``'s part after the ``before`` items it took
    earlier in the pass. ``size`` 0 is a pad: it moves the DataLoader's round-robin over
    its workers on to the reader of the next step."""

    pass_: int
    step: int
    reader: int
    size: int
    before: int


def _count(lo: int, hi: int, first: int, period: int) -> int:
    """How many ``t`` in ``[lo, hi)`` have ``t ≡ first (mod period)``."""
    if hi <= lo:
        return 0
    return (hi - 1 - first) // period - (lo - 1 - first) // period


def taken_before(
    schedule: PlanSchedule, rank: int, pass_start: int, step: int, readers: int
) -> list[int]:
    """Items each of ``rank``'s readers took in the pass that began at ``pass_start``,
    before step ``step``: reader ``j``'s steps are those ``t ≡ pass_start + j (mod
    readers)``, each of ``rank``'s size in the plan in force at ``t``."""
    taken = [0] * readers
    ends = [*schedule.starts[1:], step]
    for start, end, plan in zip(schedule.starts, ends, schedule.plans, strict=True):
        lo, hi = max(start, pass_start), min(end, step)
        for j in range(readers):
            taken[j] += plan[rank] * _count(lo, hi, pass_start + j, readers)
    return taken


class StreamSampler(PlannedSampler):
    """The plan's cut of a stream on one rank: per step, a request (:class:`Take`) to the
    reader that makes this rank's batch.

    It is the ``batch_sampler`` of the stream's ``DataLoader`` and never ends: the passes
    follow one another in the run's one iterator (:meth:`end_pass` moves to the next).
    The DataLoader sends its ``n``-th request to worker ``n mod w``, so a pad goes before
    a step wherever that would be another worker than the step's reader (at most ``w −
    1`` of them, when a pass begins or a run resumes). ``global_step`` is the first step
    not yet requested.
    """

    def __init__(self, plan: Sequence[int], rank: int, readers: int) -> None:
        super().__init__(plan, rank)
        if readers < 1:
            raise ConfigError(f"a stream needs at least one reader per rank, got {readers}")
        self.readers = readers
        #: The pass (a stream's epoch) and the global step it began at.
        self.epoch = 0
        self.pass_start = 0
        self._taken = [0] * readers

    def reader_of(self, step: int) -> int:
        return (step - self.pass_start) % self.readers

    def __iter__(self) -> Iterator[list[Take]]:
        sent = 0  # this iterator's requests: the DataLoader sends the n-th to worker n mod w
        while True:
            # State is read afresh at every request: the pass may have moved on meanwhile.
            step, worker = self.global_step, sent % self.readers
            if worker != self.reader_of(step):
                take = Take(self.epoch, step, worker, 0, 0)
            else:
                size = self.schedule.at(step)[self.rank]
                take = Take(self.epoch, step, worker, size, self._taken[worker])
                self._taken[worker] += size
                self.global_step += 1
            sent += 1
            yield [take]

    def set_plan(self, plan: Sequence[int], apply_at_step: int) -> None:
        # A pass that ended rewound the requests to its end: a plan scheduled before that
        # for a later step was never requested, and the newer plan supersedes it.
        if apply_at_step >= self.global_step:
            self.schedule.drop_after(apply_at_step)
        super().set_plan(plan, apply_at_step)

    def end_pass(self, step: int) -> None:
        """The pass ended at ``step`` (not run): the next pass begins there."""
        self.epoch += 1
        self.pass_start = step
        self.rewind(step)

    def rewind(self, step: int) -> None:
        """Request from ``step`` of the current pass on (steps requested beyond it are
        dropped; their readers go back, ``StreamReader.take``)."""
        self.global_step = step
        self._taken = taken_before(self.schedule, self.rank, self.pass_start, step, self.readers)

    def state_dict(self, step: int) -> dict[str, Any]:
        """The position of a loader that hands out ``step`` next."""
        self.schedule.prune(self.pass_start)
        return {
            "kind": "stream",
            "readers": self.readers,
            "pass": self.epoch,
            "pass_start": self.pass_start,
            "global_step": step,
            "schedule_starts": list(self.schedule.starts),
            "schedule_plans": [list(p) for p in self.schedule.plans],
        }

    def load_state_dict(self, state: dict[str, Any], plans: bool = True) -> bool:
        """Restore the position; True if the pass goes on, False if a new one starts at
        the saved step (``plans`` False, or another number of readers per rank: the parts
        are not the ones the counts were taken from). Restored plans keep their world
        size; without them, this sampler's current plan applies from the saved step."""
        if state.get("kind") != "stream":
            raise CheckpointError(
                "the checkpoint's loader read a map-style dataset, this run's reads a stream"
            )
        step = int(state["global_step"])
        world = len(self.schedule.plans[-1])
        saved = [tuple(int(b) for b in p) for p in state["schedule_plans"]]
        same = plans and int(state["readers"]) == self.readers and len(saved[-1]) == world
        if same:
            self.epoch, self.pass_start = int(state["pass"]), int(state["pass_start"])
            self.schedule = PlanSchedule([int(s) for s in state["schedule_starts"]], saved)
        else:
            self.epoch, self.pass_start = int(state["pass"]) + 1, step
            self.schedule = PlanSchedule(starts=[0], plans=[self.schedule.plans[-1]])
        self.rewind(step)
        return same


class StreamReader(Dataset[Any]):
    """The stream in each reader (a DataLoader worker, or the training thread): its part,
    one iterator per pass, and the items each request asks for.

    The stream's ``DataLoader`` sees it as a map-style dataset whose ``__getitems__``
    takes one :class:`Take`; ``worker`` fixes the reader's index within its rank (tests
    drive several readers in one process), else it is the DataLoader worker's id."""

    def __init__(
        self,
        dataset: Iterable[Any],
        rank: int,
        world_size: int,
        readers: int,
        split: str,
        worker: int | None = None,
    ) -> None:
        if split not in SPLITS:
            raise ConfigError(f"split: {split!r} is not one of {', '.join(SPLITS)}")
        if split == "items" and readers > 1 and _hugging_face_stream(dataset):
            raise ConfigError(
                "ctx.loader: a Hugging Face stream splits its shards between DataLoader "
                f"workers itself, so split='items' would keep 1 item in {readers * world_size} "
                "of each worker's shards only: give split='dataset' (after "
                "datasets.distributed.split_dataset_by_node on several ranks) or num_workers=1"
            )
        if split == "items" and world_size > 1 and _split_by_node(dataset):
            raise ConfigError(
                "ctx.loader: this Hugging Face stream is already split between ranks "
                "(datasets.distributed.split_dataset_by_node), so split='items' would split "
                f"it again and keep 1 item in {world_size} of each rank's part: give "
                "split='dataset'"
            )
        self.dataset = dataset
        self.rank, self.world_size, self.readers, self.split = rank, world_size, readers, split
        self.worker = worker
        self._pass = -1
        self._items: Iterator[Any] = iter(())
        self._taken = 0
        self._private = False  # whether ``dataset`` was made this worker's own (``_open``)

    def __getitem__(self, index: int) -> Any:
        raise TypeError("a stream is read in order, not by index")

    def __getstate__(self) -> dict[str, Any]:
        """Without the open iterator: a worker started by pickling (``spawn``) opens its own
        (a generator cannot be pickled, and the reader's position travels in the requests)."""
        return self.__dict__ | {"_pass": -1, "_items": iter(()), "_taken": 0, "_private": False}

    def __getitems__(self, takes: list[Take]) -> tuple[Take, float, list[Any] | None]:
        """``(take, start, items)``: ``start`` (``perf_counter`` seconds, in this reader)
        before reading; ``items`` None where the part ran out before ``take.size``."""
        (take,) = takes
        started = time.perf_counter()
        return take, started, self.take(take)

    def _index(self) -> int:
        if self.worker is not None:
            return self.worker
        info = get_worker_info()
        if info is None:
            return 0
        if info.num_workers != self.readers:
            raise RuntimeError(f"{info.num_workers} workers read a stream cut for {self.readers}")
        return int(info.id)

    def take(self, take: Take) -> list[Any] | None:
        """Items ``[before, before + size)`` of this reader's part in the pass, or None if
        the part ends before them (a pad: ``[]``)."""
        if take.size == 0:
            return []
        j = self._index()
        if j != take.reader:
            # The DataLoader's round-robin is what makes every step's reader the same on
            # every run; a torch that sends requests otherwise must not go unnoticed.
            raise RuntimeError(f"reader {j} got the request of reader {take.reader}")
        if take.pass_ != self._pass or self._taken > take.before:
            self._open(take.pass_, j)
        if self._taken < take.before:  # a resumed (or rewound) reader: skip what was taken
            self._taken += sum(1 for _ in islice(self._items, take.before - self._taken))
            if self._taken < take.before:
                return None
        items = list(islice(self._items, take.size))
        self._taken += len(items)
        return items if len(items) == take.size else None

    def _open(self, pass_: int, j: int) -> None:
        if not self._private and get_worker_info() is not None:
            self._private = True
            if _hugging_face_stream(self.dataset):
                # Its epoch is a tensor in shared memory, one for all of a rank's workers
                # (set_epoch in the main process reaches them so); here each reader sets
                # its own pass, and with read-ahead two readers of a rank open two passes
                # at once: one would read the other pass's order of the shards, and a
                # sample could come twice in a pass. Its own copy has an epoch of its own.
                self.dataset = copy.deepcopy(self.dataset)
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(pass_)
        items: Iterator[Any] = iter(self.dataset)
        if self.split == "items":
            readers = self.world_size * self.readers
            items = islice(items, self.rank * self.readers + j, None, readers)
        self._items, self._pass, self._taken = items, pass_, 0


def _split_by_node(dataset: object) -> bool:
    """Whether ``dataset`` is a Hugging Face stream that ``split_dataset_by_node`` made
    (it keeps its rank and world size in ``_distributed``; None on a stream of all)."""
    return _hugging_face_stream(dataset) and getattr(dataset, "_distributed", None) is not None


def _hugging_face_stream(dataset: object) -> bool:
    """Whether ``dataset`` is a Hugging Face ``datasets.IterableDataset``. In a DataLoader
    worker it yields only its shards ``worker::workers``, whatever hetero asks: not the
    whole stream that ``split="items"`` cuts. ``datasets`` is looked up, never imported:
    a dataset of it means the user imported it."""
    hf = sys.modules.get("datasets")
    stream = getattr(hf, "IterableDataset", None)
    return isinstance(stream, type) and isinstance(dataset, stream)


class StreamCollate:
    """The collate function of the stream's DataLoader: ``collate`` over a request's
    items, timed as ``TimedCollate`` times a map-style batch. Returns ``(take, batch,
    samples, seconds)``; ``batch`` None for a pad or a part that ran out."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.timed = TimedCollate(collate)

    def __call__(
        self, fetched: tuple[Take, float, list[Any] | None]
    ) -> tuple[Take, Any, int, float]:
        take, started, items = fetched
        if not items:
            return take, None, 0, 0.0
        batch, samples, seconds = self.timed((started, len(items), items))
        return take, batch, samples, seconds


def split_shards(shards: Sequence[T]) -> list[T]:
    """This reader's share of ``shards`` (files, URLs, shard names): every ``R``-th from
    its index ``r``, for a dataset that reads its own part (``split="dataset"``).

    ``r = rank · w + worker``, ``R = world · w``: the rank and world size from the
    environment (``RANK``, ``WORLD_SIZE``, as torchrun, ``hetero-train`` and agents set
    them; one rank without), the worker from ``torch.utils.data.get_worker_info()``.
    Call it in the dataset's ``__iter__``, where it runs in the reader."""
    env = RankEnv.from_env()
    info = get_worker_info()
    workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
    readers = env.world_size * workers
    if len(shards) < readers:
        raise ConfigError(
            f"{len(shards)} shard(s) for {readers} readers ({env.world_size} rank(s) x "
            f"{workers} worker(s)): give every reader at least one, or use fewer workers"
        )
    return list(shards[env.rank * workers + worker :: readers])
