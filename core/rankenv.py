"""The environment of one rank, as one typed value.

Every launcher writes a rank's variables through :meth:`RankEnv.to_env` and
every rank reads them through :meth:`RankEnv.from_env`: the coordinator puts
the job's part in a launch order's fields (``RankLaunch``), the agent makes the
rank's ``RankEnv`` of them with what only it knows and starts the process
(``hetero.agent.orders.rank_process``), ``hetero-train --nproc`` starts local ranks,
and the trainer reads the result. A value that does not parse or is out of
range is a ``ConfigError`` naming the variable.

The names are the torch.distributed ones and hetero's ``HETERO_*``; user
scripts and the docs rely on them, so they never change:

==============================  ==================================================
``RANK``, ``WORLD_SIZE``         this rank and the number of ranks
``LOCAL_RANK``                   this rank's index among the ranks on its node
``LOCAL_WORLD_SIZE``             ranks on this node (memory budgets, the backend)
``MASTER_ADDR``, ``MASTER_PORT``  the rendezvous (rank 0's node, the job's port)
``HETERO_BACKEND``               ``gloo`` or ``nccl``, chosen for the whole job
``HETERO_DEVICE``                ``cpu`` or ``cuda:N``: the device placed for this rank
``HETERO_JOB_ID``                the coordinator's job id
``HETERO_AGENT_ENDPOINT``        the agent's ``AgentLocal`` (host:port)
``HETERO_PLAN``                  the initial plan, ``VERSION:B0,B1,...``
``HETERO_EMULATE_SLOWDOWN``      this rank's emulated slowdown factor (CPU demos)
``HETERO_COLLECTIVE_TIMEOUT_S``  seconds a collective may wait for a peer
``HETERO_PROGRESS_FILE``         the file the trainer touches as it steps (watchdog)
``HETERO_ATTEMPT``               0 for the first run, +1 for each restart
``HETERO_LAUNCHED``              ``1`` when a hetero launcher started the process
``HETERO_JOB_NAME``              the job's name (``name:`` in job.yaml)
``HETERO_JOB``                   the job's terms as JSON (:class:`JobTerms`)
``OMP_NUM_THREADS``              CPU threads for this rank
==============================  ==================================================

:meth:`RankEnv.to_env` also writes :data:`PROCESS_SETTINGS` (no NVLink multicast
on a shared host) and, for NCCL, ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``. The
agent's endpoint token (``HETERO_AGENT_TOKEN``) is a credential and stays with
``hetero.security.auth``, never in a plain value that could be logged.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from hetero.core.errors import ConfigError

RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
BACKEND = "HETERO_BACKEND"
DEVICE = "HETERO_DEVICE"
JOB_ID = "HETERO_JOB_ID"
AGENT_ENDPOINT = "HETERO_AGENT_ENDPOINT"
PLAN = "HETERO_PLAN"
EMULATE_SLOWDOWN = "HETERO_EMULATE_SLOWDOWN"
COLLECTIVE_TIMEOUT_S = "HETERO_COLLECTIVE_TIMEOUT_S"
PROGRESS_FILE = "HETERO_PROGRESS_FILE"
ATTEMPT = "HETERO_ATTEMPT"
LAUNCHED = "HETERO_LAUNCHED"
JOB_NAME = "HETERO_JOB_NAME"
JOB = "HETERO_JOB"
THREADS = "OMP_NUM_THREADS"

BACKENDS = ("gloo", "nccl")
#: Set in every rank hetero starts: NVLink multicast never touches a shared host's GPUs.
PROCESS_SETTINGS = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
#: Set for NCCL ranks: a failed or timed-out collective ends the process instead of
#: leaving it blocked, so the job fails (and restarts) instead of hanging.
NCCL_SETTINGS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


@dataclass(frozen=True)
class LaunchPlan:
    """The coordinator's plan a rank starts on (``HETERO_PLAN=VERSION:B0,B1,...``),
    the same on every rank so all start on one plan without talking."""

    version: int
    batches: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.version}:{','.join(str(b) for b in self.batches)}"

    @classmethod
    def parse(cls, text: str) -> LaunchPlan:
        try:
            version, batches = text.split(":", 1)
            plan = cls(int(version), tuple(int(b) for b in batches.split(",")))
        except ValueError:
            raise ConfigError(f"{PLAN}={text!r}: expected VERSION:B0,B1,...") from None
        if plan.version < 0 or any(b < 0 for b in plan.batches):
            raise ConfigError(f"{PLAN}={text!r}: version and batches must be >= 0")
        return plan


@dataclass(frozen=True)
class JobTerms:
    """What a job file fixes that the script of a ``command:`` job must agree with
    (``HETERO_JOB``, JSON): the coordinator plans the job's batches with these, so a
    script that used others would run without hetero's plans. ``ctx.job`` in the
    script; ``ctx.loader`` takes the global batch from here when it is given none and
    refuses a different one. ``steps`` or ``epochs`` is set, not both."""

    name: str
    global_batch: int
    policy: str
    rebalance_interval: int
    min_batch: int = 1
    steps: int | None = None
    epochs: int | None = None

    def __post_init__(self) -> None:
        if self.global_batch < 1 or self.rebalance_interval < 1 or self.min_batch < 1:
            raise ConfigError(f"{JOB}: global_batch, rebalance_interval and min_batch must be >= 1")

    def to_json(self) -> str:
        terms = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(terms, separators=(",", ":"), sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> JobTerms:
        """The terms of ``HETERO_JOB``'s JSON; anything else is a ``ConfigError``."""
        known = {f.name for f in fields(cls)}
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict) or not set(raw) <= known:
                raise ValueError(f"keys must be among {sorted(known)}")
            for key, value in raw.items():
                want = str if key in ("name", "policy") else int
                if not isinstance(value, want) or isinstance(value, bool):
                    raise ValueError(f"{key} must be {want.__name__}")
            return cls(**raw)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{JOB}={text[:200]!r}: {exc}") from None

    @classmethod
    def of_options(cls, options: Mapping[str, str]) -> JobTerms | None:
        """The terms among a launch order's options (catalogue text,
        ``JobSpec.launch_options``); None without a global batch (no job file)."""
        if "global_batch" not in options:
            return None
        try:
            count = {k: int(options[k]) for k in ("steps", "epochs") if k in options}
            return cls(
                name=options.get("name", ""),
                global_batch=int(options["global_batch"]),
                policy=options.get("policy", "dynamic"),
                rebalance_interval=int(options.get("rebalance_interval", "1")),
                min_batch=int(options.get("min_batch", "1")),
                **count,
            )
        except ValueError as exc:
            raise ConfigError(f"the launch order's job terms: {exc}") from None


def term(job: JobTerms | None, key: str, asked: object, default: object, where: str) -> Any:
    """The value a script gets for the job term ``key`` when it asked for ``asked``
    (None: it gave none) at ``where``: the job file's in a job, else ``asked`` or
    ``default``. A script that asks a job for a different value is a ``ConfigError``
    naming both (the coordinator plans with the job's); with neither a job nor a
    default, one naming the missing argument."""
    if job is None:
        if asked is None and default is None:
            raise ConfigError(f"{where}: give {key}= (no job file gives one here)")
        return default if asked is None else asked
    theirs = getattr(job, key)
    if asked is not None and asked != theirs:
        raise ConfigError(
            f"{where}: {key}={asked!r}, but job {job.name!r} says {key}: {theirs!r} "
            "(leave it out to take the job's, or make the two agree)"
        )
    return theirs


@dataclass(frozen=True)
class RankEnv:
    """What a rank learns from its environment; ``None`` = not set (the default)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    backend: str | None = None
    #: ``"cpu"`` or ``"cuda:N"``: the device the coordinator placed this rank on.
    device: str | None = None
    job_id: str | None = None
    agent_endpoint: str | None = None
    plan: LaunchPlan | None = None
    #: This rank's emulated slowdown factor (1 = none).
    emulate_slowdown: float | None = None
    collective_timeout_s: float | None = None
    progress_file: Path | None = None
    attempt: int | None = None
    #: True when a hetero launcher (``hetero-train --nproc``, an agent) started the process.
    launched: bool = False
    threads: int | None = None
    #: The job file's terms (a job a coordinator launched), None otherwise.
    job: JobTerms | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"{WORLD_SIZE} must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"{RANK}={self.rank} outside {WORLD_SIZE}={self.world_size}")
        if self.local_rank < 0:
            raise ConfigError(f"{LOCAL_RANK} must be >= 0, got {self.local_rank}")
        if self.local_world_size is not None and self.local_world_size < 1:
            raise ConfigError(f"{LOCAL_WORLD_SIZE} must be >= 1, got {self.local_world_size}")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ConfigError(f"{MASTER_PORT} must be in 1..65535, got {self.master_port}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ConfigError(f"{BACKEND} must be gloo or nccl, got {self.backend!r}")
        _cuda_index(self.device)  # a device that does not parse fails here, by its name
        for name, value in (
            (EMULATE_SLOWDOWN, self.emulate_slowdown),
            (COLLECTIVE_TIMEOUT_S, self.collective_timeout_s),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a number > 0, got {value}")
        if self.attempt is not None and self.attempt < 0:
            raise ConfigError(f"{ATTEMPT} must be >= 0, got {self.attempt}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"{THREADS} must be >= 1, got {self.threads}")

    @property
    def device_index(self) -> int | None:
        """The CUDA device index of ``HETERO_DEVICE`` (None for ``cpu`` or unset)."""
        return _cuda_index(self.device)

    def cuda_index(self, cuda_devices: int) -> int | None:
        """The CUDA device this rank uses on a node with ``cuda_devices`` of them, or
        None for the CPU: the one the coordinator placed it on (``HETERO_DEVICE``),
        else ``cuda:LOCAL_RANK`` (torchrun's convention) when the node has it."""
        if self.device == "cpu":
            return None
        index = self.device_index if self.device is not None else self.local_rank
        return index if index is not None and index < cuda_devices else None

    @property
    def slowdown_spec(self) -> str | None:
        """``RANK:FACTOR`` for the trainer's emulation, or None if not slowed."""
        factor = self.emulate_slowdown or 1.0
        return f"{self.rank}:{factor:g}" if factor > 1.0 else None

    def to_env(self) -> dict[str, str]:
        """The variables to set for this rank (the unset fields are left out)."""
        env = {
            RANK: str(self.rank),
            WORLD_SIZE: str(self.world_size),
            LOCAL_RANK: str(self.local_rank),
            **PROCESS_SETTINGS,
        }
        optional: dict[str, object] = {
            LOCAL_WORLD_SIZE: self.local_world_size,
            MASTER_ADDR: self.master_addr,
            MASTER_PORT: self.master_port,
            BACKEND: self.backend,
            DEVICE: self.device,
            JOB_ID: self.job_id,
            AGENT_ENDPOINT: self.agent_endpoint,
            PLAN: self.plan,
            PROGRESS_FILE: self.progress_file,
            ATTEMPT: self.attempt,
            THREADS: self.threads,
        }
        env.update({k: str(v) for k, v in optional.items() if v is not None})
        for name, value in (
            (EMULATE_SLOWDOWN, self.emulate_slowdown),
            (COLLECTIVE_TIMEOUT_S, self.collective_timeout_s),
        ):
            if value is not None:
                env[name] = _number_text(value)
        if self.launched:
            env[LAUNCHED] = "1"
        if self.job is not None:
            env[JOB], env[JOB_NAME] = self.job.to_json(), self.job.name
        if self.backend == "nccl":
            env.update(NCCL_SETTINGS)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        """The rank's environment (``os.environ`` if not given); empty values count as unset."""
        env = _Reader(os.environ if environ is None else environ)
        plan = env.text(PLAN)
        timeout = env.number(COLLECTIVE_TIMEOUT_S)
        progress = env.text(PROGRESS_FILE)
        job = env.text(JOB)
        rank, world_size, local_rank = (
            env.integer(RANK),
            env.integer(WORLD_SIZE),
            env.integer(LOCAL_RANK),
        )
        return cls(
            rank=0 if rank is None else rank,
            world_size=1 if world_size is None else world_size,
            local_rank=0 if local_rank is None else local_rank,
            local_world_size=env.integer(LOCAL_WORLD_SIZE),
            master_addr=env.text(MASTER_ADDR),
            master_port=env.integer(MASTER_PORT),
            backend=env.text(BACKEND),
            device=env.text(DEVICE),
            job_id=env.text(JOB_ID),
            agent_endpoint=env.text(AGENT_ENDPOINT),
            plan=LaunchPlan.parse(plan) if plan is not None else None,
            emulate_slowdown=env.number(EMULATE_SLOWDOWN),
            collective_timeout_s=timeout,
            progress_file=Path(progress) if progress is not None else None,
            attempt=env.integer(ATTEMPT),
            launched=env.text(LAUNCHED) == "1",
            threads=env.integer(THREADS),
            job=JobTerms.parse(job) if job is not None else None,
        )

    @staticmethod
    def distributed(environ: Mapping[str, str] | None = None) -> bool:
        """True if a launcher (torchrun, ``hetero-train --nproc``, an agent) set
        ``RANK`` and ``WORLD_SIZE``: this process is one rank of a group."""
        env = os.environ if environ is None else environ
        return RANK in env and WORLD_SIZE in env


def _cuda_index(device: str | None) -> int | None:
    """``N`` of ``cuda:N``; None for ``cpu`` or None; anything else is a ConfigError."""
    if device is None or device == "cpu":
        return None
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index.isdigit():
        raise ConfigError(f"{DEVICE} must be cpu or cuda:N, got {device!r}")
    return int(index)


def _number_text(value: float) -> str:
    """``60`` for 60.0 (as people write it), the exact repr where ``:g`` would round."""
    text = f"{value:g}"
    return text if float(text) == value else repr(value)


class _Reader:
    """Typed reads of environment variables; a bad value is a ConfigError naming it."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def text(self, name: str) -> str | None:
        value = self.environ.get(name, "")
        return value if value != "" else None

    def integer(self, name: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None

    def number(self, name: str) -> float | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"environment variable {name}={value!r} is not a number") from None
