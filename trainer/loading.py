"""``ctx.loader``'s work: the plan a run starts from, and the loader its dataset needs.

A map-style dataset (``__getitem__`` and ``__len__``) gets a ``HeteroLoader``, which
cuts a seeded permutation of its indices (``trainer.loader``); a stream (a
``torch.utils.data.IterableDataset``, or any iterable without ``__getitem__``) gets
a ``StreamLoader``, whose readers draw each rank's share from its part of the stream
(``trainer.streamloader``). Both start from the same first plan: under an agent the
coordinator's (the same environment on every rank), else the policy's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from torch.utils.data import Dataset, IterableDataset, default_collate

from hetero.core.balancer import Constraints, make_policy
from hetero.core.errors import ConfigError
from hetero.trainer import attach, control
from hetero.trainer.exchange import EmbeddedPlanner, RankSummary
from hetero.trainer.loader import HeteroLoader
from hetero.trainer.preflight import too_small
from hetero.trainer.rebalance import PlanRecord
from hetero.trainer.sampler import UnevenBatchSampler
from hetero.trainer.stream import StreamSampler
from hetero.trainer.streamloader import StreamLoader

if TYPE_CHECKING:
    from hetero.trainer.context import Context

#: What ``ctx.loader`` returns.
Loader: TypeAlias = "HeteroLoader | StreamLoader"


def is_stream(dataset: object) -> bool:
    """Whether ``dataset`` is read by iterating it rather than by index."""
    return isinstance(dataset, IterableDataset) or (
        hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")
    )


def open_loader(
    ctx: Context,
    dataset: Dataset[Any] | Iterable[Any],
    global_batch: int,
    *,
    seed: int,
    num_workers: int,
    prefetch_factor: int,
    drop_last: bool,
    pin_memory: bool,
    collate_fn: Callable[[Any], Any] | None,
    split: str | None,
) -> Loader:
    """The loader of ``dataset`` for ``ctx``, its first plan recorded in ``ctx.plans`` and
    the planner set up if none was (module doc). ``split`` applies to streams only."""
    if ctx.pipeline is not None:
        return _open_replicas(
            ctx,
            dataset,
            global_batch,
            seed=seed,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            pin_memory=pin_memory,
            collate_fn=collate_fn,
        )
    if global_batch < ctx.config.min_batch * ctx.world_size:
        given = "ctx.loader: global_batch"
        raise ConfigError(too_small(given, global_batch, ctx.world_size, ctx.config.min_batch))
    constraints = Constraints(global_batch, ctx.world_size, ctx.config.min_batch, ctx.max_batch)
    policy = make_policy(ctx.config.policy)
    launched = control.launch_plan(constraints, ctx.env.plan)
    initial = launched.batches if launched else policy.initial(constraints, ctx.profiles)
    stream = is_stream(dataset)
    if split is not None and not stream:
        raise ConfigError(f"ctx.loader: split={split!r} is for streams, not a map-style dataset")
    if ctx.planner is None:
        embedded = EmbeddedPlanner(policy, constraints, ctx.profiles)

        def progress() -> tuple[int, Sequence[RankSummary] | None]:
            return ctx.global_step, ctx.summaries[-1] if ctx.summaries else None

        if attach.wanted(ctx):  # launched elsewhere, a coordinator named: attach the job
            ctx.planner = attach.planner(ctx, embedded, constraints, progress)
        else:
            ctx.planner = control.planner_from_env(ctx.env, embedded, constraints, progress)
    ctx.plans = [PlanRecord(0, 0, initial, f"initial ({policy.name})")]
    if stream:
        return StreamLoader(
            ctx,
            dataset,  # type: ignore[arg-type]
            StreamSampler(initial, ctx.rank, max(num_workers, 1)),
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            pin_memory=pin_memory,
            collate_fn=collate_fn or default_collate,
            split=split or "items",
        )
    sampler = UnevenBatchSampler(
        len(dataset),  # type: ignore[arg-type]
        initial,
        ctx.rank,
        seed=seed,
        min_batch=ctx.config.min_batch,
        drop_last=drop_last,
    )
    return HeteroLoader(
        ctx,
        dataset,  # type: ignore[arg-type]
        sampler,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        pin_memory=pin_memory,
        collate_fn=collate_fn,
    )


def _open_replicas(
    ctx: Context,
    dataset: Dataset[Any] | Iterable[Any],
    global_batch: int,
    *,
    seed: int,
    num_workers: int,
    prefetch_factor: int,
    pin_memory: bool,
    collate_fn: Callable[[Any], Any] | None,
) -> Loader:
    """The loader of a pipelined model (``ctx.wrap(model, pipeline=N)``): every stage of a
    replica draws the replica's share, and the plans are the replicas', in whole
    microbatches (``trainer.pipeline.wrap``). The policy plans the replicas inside this
    process, also under an agent: a coordinator plans ranks, not replicas. An epoch's
    short last step is dropped, since a share of it would not be whole microbatches."""
    from hetero.core.pipeplan import microbatch_for
    from hetero.trainer.pipeline.replicas import MicrobatchPlanner

    assert ctx.pipeline is not None and ctx.layout is not None
    if is_stream(dataset):
        raise ConfigError("ctx.loader: a pipelined model reads a map-style dataset, not a stream")
    pipe, replicas = ctx.pipeline.pipe, ctx.layout.replicas
    pipe.microbatch = mu = microbatch_for(global_batch, replicas, pipe.microbatch)
    constraints = Constraints(global_batch // mu, replicas, 1, None)
    policy = make_policy(ctx.config.policy)
    profiles = None
    if ctx.profiles is not None:  # a replica is as fast as its slowest stage's device
        profiles = [
            min(
                (ctx.profiles[r] for r in ctx.layout.replica_ranks(k)),
                key=lambda p: p.compute_score,
            )
            for k in range(replicas)
        ]
    initial = tuple(b * mu for b in policy.initial(constraints, profiles))
    if ctx.planner is None:
        ctx.planner = MicrobatchPlanner(EmbeddedPlanner(policy, constraints, profiles), mu)
    reason = f"initial ({policy.name}, {replicas} replicas of {ctx.layout.stages} stages)"
    ctx.plans = [PlanRecord(0, 0, initial, reason)]
    sampler = UnevenBatchSampler(
        len(dataset),  # type: ignore[arg-type]
        initial,
        ctx.dp_rank,
        seed=seed,
        min_batch=mu,
        drop_last=True,
    )
    return HeteroLoader(
        ctx,
        dataset,  # type: ignore[arg-type]
        sampler,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        pin_memory=pin_memory,
        collate_fn=collate_fn,
    )
