"""The job spec: ``job.yaml`` parsed once into frozen, typed dataclasses.

A job runs either a built-in ``model`` on a ``dataset`` or the user's own
``command`` (a script using the trainer API). Every error is a ``ConfigError``
naming the file, line and field; unknown keys get a "did you mean" hint.
``docs/jobspec.md`` documents the schema; keep the two in step.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hetero.coordinator.roots import path_problem
from hetero.core import defaults
from hetero.core.balancer import POLICIES
from hetero.core.errors import ConfigError
from hetero.core.yamlfields import Fields

MODELS = ("debug", "simple_cnn", "resnet18", "resnet50")
DATASETS = ("synthetic", "imagefolder")
DEVICE_KINDS = ("any", "cuda", "cpu")
#: A slowdown factor above this is a typo, not a demo.
MAX_EMULATED_SLOWDOWN = 100.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Upper bounds: a value past these is a typo (or an attack), and several travel as
# int32 in hetero.v1 messages, where a larger value could not be sent at all.
#: Bytes of job.yaml text; a spec is a page of YAML.
MAX_SPEC_BYTES = 1024 * 1024
MAX_RANKS = 4096
MAX_GLOBAL_BATCH = 2**24
MAX_STEPS = 10**8
MAX_EPOCHS = 10**6
MAX_INTERVAL_STEPS = 10**8
MAX_RESTARTS = 1000
MAX_SEED = 2**63 - 1
MAX_COMMAND_ARGS = 4096
#: Bytes of one command argument (Linux MAX_ARG_STRLEN).
MAX_ARG_BYTES = 128 * 1024


@dataclass(frozen=True)
class Resources:
    """Where the job's ranks may run.

    ``device`` is ``cuda``, ``cpu`` or ``any``; with ``any``, CUDA devices are
    preferred and CPU devices are used only if ``allow_cpu``. ``nodes`` lists the
    node names allowed (empty = any healthy node).
    """

    ranks: int
    nodes: tuple[str, ...] = ()
    allow_cpu: bool = True
    device: str = "any"


@dataclass(frozen=True)
class Checkpoint:
    dir: str
    interval_steps: int


@dataclass(frozen=True)
class JobSpec:
    """A validated job. Exactly one of ``model`` / ``command`` is set, and one of
    ``steps`` / ``epochs``. ``emulate_slowdown[r]`` is rank r's emulated factor
    (1.0 = none), one entry per rank."""

    name: str
    global_batch: int
    resources: Resources
    policy: str
    rebalance_interval: int
    model: str | None = None
    dataset: str | None = None
    data_dir: str | None = None
    command: tuple[str, ...] = ()
    steps: int | None = None
    epochs: int | None = None
    checkpoint: Checkpoint | None = None
    max_restarts: int = 0
    emulate_slowdown: tuple[float, ...] = field(default=())
    lr: float = 0.1
    seed: int = 0
    min_batch: int = 1
    collective_timeout_s: float = defaults.JOB_COLLECTIVE_TIMEOUT_S

    @property
    def world_size(self) -> int:
        return self.resources.ranks

    @property
    def emulated(self) -> bool:
        return any(f != 1.0 for f in self.emulate_slowdown)


def load_jobspec(path: str | Path) -> JobSpec:
    """Read and parse a job file; a missing or unreadable file is a ``ConfigError``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read job file {path}: {exc.strerror}") from None
    return parse_jobspec(text, source=str(path))


def parse_jobspec(
    text: str, source: str = "job.yaml", *, allowed_roots: Sequence[str] | None = None
) -> JobSpec:
    """Parse and validate the YAML text of a job spec.

    ``allowed_roots``: directories ``checkpoint.dir`` and ``data_dir`` must lie under
    (``coordinator.roots``); None checks only that they are absolute."""
    if len(text) > MAX_SPEC_BYTES:  # characters >= bytes / 4: cheap before encoding
        raise ConfigError(
            f"{source}: job spec is {len(text):,} characters, limit {MAX_SPEC_BYTES:,}"
        )
    top = Fields.parse(text, source)
    name = top.string("name")
    if name is None:
        raise ConfigError(f"{source}:{top.line_of('name')}: name: required")
    if not _NAME.match(name):
        raise top.fail("name", f"must be 1-64 letters, digits, '.', '_' or '-', got {name[:70]!r}")

    resources = _resources(top)
    global_batch = top.integer("global_batch", minimum=1, maximum=MAX_GLOBAL_BATCH)
    if global_batch is None:
        raise top.fail("global_batch", "required (samples per step, summed over all ranks)")
    min_batch = top.integer("min_batch", 1, minimum=1, maximum=MAX_GLOBAL_BATCH) or 1
    if global_batch < min_batch * resources.ranks:
        raise top.fail(
            "global_batch",
            f"{global_batch} is smaller than min_batch {min_batch} x {resources.ranks} ranks",
        )

    model, dataset, data_dir, command = _workload(top, allowed_roots)
    steps = top.integer("steps", minimum=1, maximum=MAX_STEPS)
    epochs = top.integer("epochs", minimum=1, maximum=MAX_EPOCHS)
    if steps is not None and epochs is not None:
        raise top.fail("epochs", "give either steps or epochs, not both")
    if steps is None and epochs is None:
        raise top.fail("steps", "required: give steps or epochs")

    policy = top.choice("policy", sorted(POLICIES), "dynamic") or "dynamic"
    rebalance_interval = (
        top.integer(
            "rebalance_interval",
            defaults.JOB_REBALANCE_INTERVAL_STEPS,
            minimum=1,
            maximum=MAX_INTERVAL_STEPS,
        )
        or defaults.JOB_REBALANCE_INTERVAL_STEPS
    )
    spec = JobSpec(
        name=name,
        global_batch=global_batch,
        resources=resources,
        policy=policy,
        rebalance_interval=rebalance_interval,
        model=model,
        dataset=dataset,
        data_dir=data_dir,
        command=command,
        steps=steps,
        epochs=epochs,
        checkpoint=_checkpoint(top, allowed_roots),
        max_restarts=top.integer("max_restarts", 0, minimum=0, maximum=MAX_RESTARTS) or 0,
        emulate_slowdown=_slowdowns(top, resources.ranks),
        lr=top.number("lr", 0.1, positive=True) or 0.1,
        seed=top.integer("seed", 0, minimum=0, maximum=MAX_SEED) or 0,
        min_batch=min_batch,
        collective_timeout_s=top.number(
            "collective_timeout_s",
            defaults.JOB_COLLECTIVE_TIMEOUT_S,
            positive=True,
            maximum=86400.0,
        )
        or defaults.JOB_COLLECTIVE_TIMEOUT_S,
    )
    top.finish()
    return spec


def _resources(top: Fields) -> Resources:
    res = top.mapping("resources")
    if res is None:
        raise top.fail("resources", "required, e.g. `resources: {ranks: 2}`")
    ranks = res.integer("ranks", minimum=1, maximum=MAX_RANKS)
    if ranks is None:
        raise res.fail("ranks", "required (number of training processes)")
    device = res.choice("device", DEVICE_KINDS, "any") or "any"
    allow_cpu = res.boolean("allow_cpu", True)
    if device == "cpu" and not allow_cpu:
        raise res.fail("allow_cpu", "is false but device is cpu: no device could run the job")
    nodes: tuple[str, ...] = ()
    node = res.raw("nodes")
    if node is not None:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise res.fail("nodes", "must be a non-empty list of node names")
        values = [
            res.value_of(n, "nodes") if isinstance(n, yaml.ScalarNode) else None for n in node.value
        ]
        if any(not isinstance(v, str) or not v for v in values):
            raise res.fail("nodes", "must be a list of node names (strings)")
        nodes = tuple(str(v) for v in values)
    res.finish()
    return Resources(ranks=ranks, nodes=nodes, allow_cpu=allow_cpu, device=device)


def _workload(
    top: Fields, roots: Sequence[str] | None
) -> tuple[str | None, str | None, str | None, tuple[str, ...]]:
    command = _command(top)
    if command:
        for key in ("model", "dataset", "data_dir"):
            if top.has(key):
                top.raw(key)  # read, so finish() reports the conflict, not "unknown"
                raise top.fail(key, "not allowed with command: (the script builds its own)")
        return None, None, None, command
    model = top.choice("model", MODELS)
    if model is None:
        raise top.fail("model", f"required: a built-in model ({', '.join(MODELS)}) or command:")
    dataset = top.choice("dataset", DATASETS, "synthetic") or "synthetic"
    data_dir = top.string("data_dir")
    if dataset == "imagefolder" and data_dir is None:
        raise top.fail_near("dataset", "data_dir", "required when dataset is imagefolder")
    if dataset == "synthetic" and data_dir is not None:
        raise top.fail("data_dir", "only used with dataset: imagefolder")
    if data_dir is not None and (problem := path_problem(data_dir, roots)):
        raise top.fail("data_dir", problem)
    return model, dataset, data_dir, ()


def _command(top: Fields) -> tuple[str, ...]:
    args = _command_args(top)
    if len(args) > MAX_COMMAND_ARGS:
        raise top.fail("command", f"has {len(args)} arguments, limit {MAX_COMMAND_ARGS}")
    for arg in args:
        if "\x00" in arg:
            raise top.fail("command", "arguments must not contain a NUL character")
        if len(arg.encode("utf-8", errors="replace")) > MAX_ARG_BYTES:
            raise top.fail("command", f"an argument is longer than {MAX_ARG_BYTES:,} bytes")
    return args


def _command_args(top: Fields) -> tuple[str, ...]:
    node = top.raw("command")
    if node is None:
        return ()
    if isinstance(node, yaml.ScalarNode):
        value = top.value_of(node, "command")
        if not isinstance(value, str) or not value.strip():
            raise top.fail("command", "must be a command line or a list of arguments")
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise top.fail("command", f"cannot split into arguments: {exc}") from None
    if isinstance(node, yaml.SequenceNode) and node.value:
        args = [
            top.value_of(n, "command") if isinstance(n, yaml.ScalarNode) else None
            for n in node.value
        ]
        if all(isinstance(a, str | int | float) and not isinstance(a, bool) for a in args):
            return tuple(str(a) for a in args)
    raise top.fail("command", "must be a command line or a non-empty list of arguments")


def _checkpoint(top: Fields, roots: Sequence[str] | None) -> Checkpoint | None:
    ck = top.mapping("checkpoint")
    if ck is None:
        return None
    directory = ck.string("dir")
    if directory is None:
        raise ck.fail("dir", "required (directory shared by the job's nodes)")
    if problem := path_problem(directory, roots):
        raise ck.fail("dir", problem)
    interval = ck.integer("interval_steps", 500, minimum=1, maximum=MAX_INTERVAL_STEPS) or 500
    ck.finish()
    return Checkpoint(dir=directory, interval_steps=interval)


def _slowdowns(top: Fields, ranks: int) -> tuple[float, ...]:
    """``emulate_slowdown`` as a list (one factor per rank) or a mapping ``{rank: factor}``."""
    node = top.raw("emulate_slowdown")
    factors = [1.0] * ranks
    if node is None:
        return tuple(factors)
    key = "emulate_slowdown"
    if isinstance(node, yaml.SequenceNode):
        if len(node.value) != ranks:
            raise top.fail(key, f"has {len(node.value)} entries for {ranks} ranks")
        pairs = list(enumerate(node.value))
    elif isinstance(node, yaml.MappingNode):
        pairs = []
        for key_node, value_node in node.value:
            rank = top.value_of(key_node, key)
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
                raise top.fail(key, f"rank {rank!r} is not in 0..{ranks - 1}", key_node)
            pairs.append((rank, value_node))
    else:
        raise top.fail(key, "must be a list (one factor per rank) or a mapping {rank: factor}")
    for rank, value_node in pairs:
        value = top.value_of(value_node, key) if isinstance(value_node, yaml.ScalarNode) else None
        where = f"{key}[{rank}]"
        factor = top.check_number(where, value, minimum=1.0, node=value_node)
        if factor > MAX_EMULATED_SLOWDOWN:
            limit = f"{MAX_EMULATED_SLOWDOWN:g}"
            raise top.fail(where, f"must be <= {limit}, got {factor:g}", value_node)
        factors[rank] = factor
    return tuple(factors)
