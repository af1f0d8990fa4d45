"""A rank started by Slurm's ``srun``: its task variables as torch.distributed's.

``srun -n3 python train.py`` starts three tasks and tells each ``SLURM_PROCID`` (its
rank), ``SLURM_NTASKS`` (the step's tasks), ``SLURM_LOCALID`` and ``SLURM_NODEID``, and
the step's nodes (``SLURM_STEP_NODELIST``, compressed: ``node[01-03,07],gpu-a[1-2]``);
it sets none of ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``, which ``hetero.core.rankenv.RankEnv`` and ``init_process_group`` read.
:func:`torch_env` derives them; :func:`adopt` writes them into this process's
environment before anything reads it, so every reader (the trainer's ``RankEnv``,
the ``env://`` rendezvous, Gloo's choice of interface) sees one job.

- rank 0 of the group runs on the first host of the step's node list (Slurm places
  tasks in node-list order: task 0 is on that node), and its rendezvous port is the
  job id's last four digits + 15000 (15000-24999, as PyTorch Lightning picks it, so a
  job mixing both agrees), unless ``MASTER_PORT`` is set: two steps of one job running
  at once need a ``MASTER_PORT`` each.
- torchrun's variables win wherever they are set (``srun torchrun ...`` starts one
  torchrun per node; its ranks carry both sets, and torchrun's describe the group).
- a task Slurm bound to one GPU of its own (``--gpus-per-task=1``: Slurm allocated
  GPUs, and this task's ``CUDA_VISIBLE_DEVICES`` names one while its node runs
  several tasks) is placed on it, ``HETERO_DEVICE=cuda:0``: torchrun's convention,
  ``cuda:LOCAL_RANK``, would look for a GPU the task cannot see and fall back to the
  CPU.
- a step of one task is a process alone, as outside Slurm: nothing is set.
- a batch script's own step (``sbatch -n3`` running ``python train.py`` without
  ``srun``) has ``SLURM_NTASKS=3`` and ``SLURM_PROCID=0`` but no step: its one process
  would wait for two peers that never start. That, and any task variable missing or
  malformed where several tasks are said, is a ``ConfigError`` naming the variables.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Mapping, MutableMapping

from hetero.core import rankenv
from hetero.core.errors import ConfigError

log = logging.getLogger("hetero.trainer")

PROCID = "SLURM_PROCID"
NTASKS = "SLURM_NTASKS"
LOCALID = "SLURM_LOCALID"
NODEID = "SLURM_NODEID"
STEP_ID = "SLURM_STEP_ID"
STEP_NODELIST = "SLURM_STEP_NODELIST"
JOB_NODELIST = "SLURM_JOB_NODELIST"
STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"
JOB_ID = "SLURM_JOB_ID"
STEP_GPUS = "SLURM_STEP_GPUS"
JOB_GPUS = "SLURM_JOB_GPUS"
VISIBLE_GPUS = "CUDA_VISIBLE_DEVICES"

#: The rendezvous port of job id J: ``int(J[-4:]) + PORT_BASE`` (module doc).
PORT_BASE = 15000

#: One host expression: a run of text without brackets or commas, then bracketed
#: ranges, each followed by more text: ``gpu-a[1-2]``, ``rack[1-2]-n[01-04]``.
_PIECE = re.compile(r"([^\[\],]*)(?:\[([^\[\]]*)\])?")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_REPEAT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def expand_hostlist(text: str) -> list[str]:
    """The hosts of a Slurm host list, in its order: ``node[01-03,07],gpu-a[1-2]`` ->
    ``node01 node02 node03 node07 gpu-a1 gpu-a2``.

    Slurm's grammar: host expressions separated by commas outside brackets; in an
    expression, each ``[...]`` holds comma-separated numbers and ``lo-hi`` ranges,
    and an expression with several brackets names every combination, leftmost
    varying slowest. A range keeps its low bound's zero padding (``[08-11]``: 08 09
    10 11). A ``ValueError`` names the malformed part."""
    hosts: list[str] = []
    for expression in _split_outside_brackets(text.strip()):
        if not expression:
            raise ValueError(f"empty host name in host list {text!r}")
        hosts.extend(_expand_expression(expression, text))
    return hosts


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in host list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unmatched ']' in host list {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unclosed '[' in host list {text!r}")
    parts.append(text[start:])
    return parts


def _expand_expression(expression: str, text: str) -> list[str]:
    """The names of one host expression: its literal runs and the product of its ranges."""
    choices: list[list[str]] = []
    pos = 0
    while pos < len(expression):
        match = _PIECE.match(expression, pos)
        assert match is not None and match.end() > pos  # a bracket was checked to close
        literal, ranges = match.groups()
        choices.append([literal])
        if ranges is not None:
            choices.append(_expand_ranges(ranges, text))
        pos = match.end()
    return ["".join(parts) for parts in itertools.product(*choices)]


def _expand_ranges(ranges: str, text: str) -> list[str]:
    numbers: list[str] = []
    for item in ranges.split(","):
        match = _RANGE.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"bad range {item!r} in host list {text!r}")
        lo, hi = match.group(1), match.group(2) or match.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in host list {text!r}")
        width = len(lo)
        numbers.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return numbers


def expand_counts(text: str) -> list[int]:
    """Slurm's compressed counts per node (``SLURM_STEP_TASKS_PER_NODE``): ``2(x3),1``
    -> ``[2, 2, 2, 1]``. A ``ValueError`` names the malformed part."""
    counts: list[int] = []
    for item in text.split(","):
        match = _REPEAT.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"bad count {item!r} in {text!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def port_from_job_id(job_id: str) -> int:
    """The rendezvous port of Slurm job ``job_id``: its last four digits + 15000 (the
    job's ranks agree on it without talking). Array and heterogeneous job ids
    (``123_4``, ``123+0``) count their digits alone."""
    digits = "".join(c for c in job_id if c.isdigit())
    if not digits:
        raise ValueError(f"job id {job_id!r} has no digits")
    return int(digits[-4:]) + PORT_BASE


def torch_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables a Slurm task lacks (module doc), or ``{}`` where
    Slurm did not start several tasks or torchrun's variables describe the group.

    The values written are ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE`` (this node's tasks), ``MASTER_ADDR``, ``MASTER_PORT`` and,
    for a task bound to one GPU, ``HETERO_DEVICE``; one already set (and not empty)
    is kept. A ``ConfigError`` names the variables
    where several tasks are said but no group can be formed."""

    def given(name: str) -> str | None:
        value = environ.get(name, "")
        return value or None

    if given(rankenv.RANK) and given(rankenv.WORLD_SIZE):
        return {}  # torchrun (or a hetero launcher) started this process: its group
    ntasks = given(NTASKS)
    if ntasks is None:
        return {}
    world = _integer(NTASKS, ntasks)
    if world <= 1:
        return {}
    if given(STEP_ID) is None or given(PROCID) is None:
        raise ConfigError(
            f"{NTASKS}={ntasks} but this process is not one task of an srun step "
            f"({STEP_ID} or {PROCID} unset, as in a batch script or an salloc shell): start "
            "each rank with srun (srun python train.py), or torchrun inside srun"
        )
    missing = [n for n in (LOCALID, NODEID) if given(n) is None]
    nodelist_name = STEP_NODELIST if given(STEP_NODELIST) else JOB_NODELIST
    nodelist = given(nodelist_name)
    if nodelist is None and given(rankenv.MASTER_ADDR) is None:
        missing.append(f"{STEP_NODELIST} (or {JOB_NODELIST}, or {rankenv.MASTER_ADDR})")
    if given(JOB_ID) is None and given(rankenv.MASTER_PORT) is None:
        missing.append(f"{JOB_ID} (or {rankenv.MASTER_PORT})")
    if missing:
        raise ConfigError(
            f"{NTASKS}={ntasks} says {world} tasks, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} unset: cannot form the process group"
        )
    node = _integer(NODEID, environ[NODEID])
    derived = {
        rankenv.RANK: str(_integer(PROCID, environ[PROCID])),
        rankenv.WORLD_SIZE: str(world),
        rankenv.LOCAL_RANK: str(_integer(LOCALID, environ[LOCALID])),
    }
    per_node = given(STEP_TASKS_PER_NODE)
    on_node = _on_node(per_node, node) if per_node is not None else None
    if on_node is not None:
        derived[rankenv.LOCAL_WORLD_SIZE] = str(on_node)
    visible = given(VISIBLE_GPUS)
    slurm_gpus = given(STEP_GPUS) or given(JOB_GPUS)
    if slurm_gpus and visible and "," not in visible and (on_node or 1) > 1:
        derived[rankenv.DEVICE] = "cuda:0"  # the one GPU Slurm bound to this task
    if nodelist is not None and given(rankenv.MASTER_ADDR) is None:
        try:
            derived[rankenv.MASTER_ADDR] = expand_hostlist(nodelist)[0]
        except ValueError as exc:
            raise ConfigError(f"{nodelist_name}: {exc}") from None
    job_id = given(JOB_ID)
    if job_id is not None and given(rankenv.MASTER_PORT) is None:
        try:
            derived[rankenv.MASTER_PORT] = str(port_from_job_id(job_id))
        except ValueError as exc:
            raise ConfigError(f"{JOB_ID}: {exc}") from None
    return {k: v for k, v in derived.items() if given(k) is None}


def _on_node(per_node: str, node: int) -> int:
    try:
        counts = expand_counts(per_node)
    except ValueError as exc:
        raise ConfigError(f"{STEP_TASKS_PER_NODE}: {exc}") from None
    if not 0 <= node < len(counts):
        raise ConfigError(
            f"{NODEID}={node} outside {STEP_TASKS_PER_NODE}={per_node!r} ({len(counts)} nodes)"
        )
    return counts[node]


def _integer(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def adopt(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Write :func:`torch_env` into ``environ`` (this process's environment if not
    given) and return what was written: ``ht.init`` and ``hetero-train`` call it first."""
    env = os.environ if environ is None else environ
    derived = torch_env(env)
    if derived:
        env.update(derived)
        where = f"{env.get(rankenv.MASTER_ADDR)}:{env.get(rankenv.MASTER_PORT)}"
        log.info(
            "Slurm task %s of %s: rendezvous at %s",
            env[rankenv.RANK],
            env[rankenv.WORLD_SIZE],
            where,
        )
    return derived
