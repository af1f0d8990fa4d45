"""``init``: join the job the environment describes (or run alone) and return its context."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from hetero.core import defaults
from hetero.core.balancer import DeviceProfile
from hetero.core.errors import HeteroError
from hetero.core.rankenv import RankEnv, term
from hetero.trainer import slurm
from hetero.trainer.bootstrap import TrainerConfig
from hetero.trainer.context import Context


def init(
    policy: str | None = None,
    *,
    rebalance_interval: int | None = None,
    profiles: Sequence[DeviceProfile] | None = None,
    **options: Any,
) -> Context:
    """Join the job described by the environment (or run alone) and return its context.

    The environment is torchrun's, an agent's or ``hetero-train``'s (``RANK``,
    ``WORLD_SIZE``, ...), or Slurm's for a rank started by ``srun``
    (``hetero.trainer.slurm``: torchrun's variables win where both are set).

    In a job a coordinator launched (a ``command:`` job), the job file's terms rule
    (``ctx.job``: name, global batch, steps or epochs, policy, rebalance interval):
    ``policy`` and ``rebalance_interval`` default to the job's, and a script that asks
    for different ones fails at once with one line naming both. Outside a job they
    default to ``"dynamic"`` and ``defaults.REBALANCE_INTERVAL_STEPS``.

    ``options`` are the training loop's options of the catalogue
    (``hetero.core.catalogue``, the same names, defaults and bounds as
    ``hetero-train``'s flags and job.yaml's keys): ``min_batch``, ``max_batch``,
    ``emulate_slowdown``, ``output_dir``, ``device``, ``backend``, ``warmup_steps``,
    ``settle_steps``, ``history_intervals``, ``collective_timeout_s``,
    ``compute_scores``, ``gpu_profiles``, ``comm``, ``shard``, ``offload``, ``pipeline``
    (the stages ``ctx.wrap`` cuts the model into), ``tensorboard``
    (a directory: rank 0 writes every interval's figures there, ``trainer.tensorboard``). A
    bad one is a ``ConfigError`` naming it.

    A ``HeteroError`` (a user's mistake, such as a global batch smaller than the ranks)
    that the script leaves uncaught is printed as one line, ``error: ...``, and the
    process exits non-zero, as for hetero-train (:func:`one_line_errors`).
    """
    from hetero.core.catalogue.keywords import init_keywords

    slurm.adopt()  # first: everything below reads RANK, WORLD_SIZE, ... from the environment
    env = RankEnv.from_env()
    one_line_errors(env.rank)
    # Under a coordinator the job file's terms rule (``ctx.job``); a script asking for others
    # would run without the coordinator's plans.
    policy = term(env.job, "policy", policy, "dynamic", "ht.init")
    rebalance_interval = term(
        env.job,
        "rebalance_interval",
        rebalance_interval,
        defaults.REBALANCE_INTERVAL_STEPS,
        "ht.init",
    )

    given = init_keywords(
        {
            "policy": policy,
            "rebalance_interval": rebalance_interval,
            **{k: v for k, v in options.items() if v is not None},
        }
    )
    scores, profile_file = given.pop("compute_scores", None), given.pop("gpu_profiles", None)
    if profiles is None and (scores is not None or profile_file is not None):
        from hetero.trainer.jobconfig import JobConfig
        from hetero.trainer.jobconfig import profiles as read_profiles

        profiles = read_profiles(JobConfig(compute_scores=scores, gpu_profiles=profile_file))
    for name in ("output_dir", "tensorboard"):
        if name in given:
            given[name] = Path(given[name])
    if "max_batch" in given:
        caps = tuple(None if p == "-" else int(p) for p in given["max_batch"].split(","))
        given["max_batch"] = caps * RankEnv.from_env().world_size if len(caps) == 1 else caps
    return Context(TrainerConfig(**given), profiles=profiles)


def one_line_errors(rank: int) -> None:
    """Print a ``HeteroError`` the script does not catch as ``error: [rank R: ]message``
    (exit status 1, as for any uncaught exception) instead of a traceback; every other
    exception keeps its traceback. A hook the user installed is left alone."""
    if sys.excepthook is not sys.__excepthook__:
        return

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, HeteroError):
            where = f"rank {rank}: " if rank else ""
            print(f"error: {where}{exc}", file=sys.stderr, flush=True)
        else:
            sys.__excepthook__(kind, exc, tb)

    sys.excepthook = hook
